"""The coordinator: plan the workers, drive the warm-up and windows, decide stability, build the result."""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from farm.errors import LoadGenError
from schemas import MeasurementSettings, TensorSpec
from schemas.input_data import InputData
from schemas.result import CLIENT_LIMITED_NOTE, client_limited
from workers import grpc_env
from workers.loadgen import stats
from workers.loadgen.drivers import Driver, ProcessDriver, ThreadDriver
from workers.loadgen.messages import (
    Ready,
    WarmupReport,
    WindowReport,
    WindowSummary,
    WorkerDone,
    WorkerError,
    WorkerMessage,
)
from workers.loadgen.request import serialized_requests
from workers.loadgen.worker import WorkerConfig

BUSY_LIMIT_PCT = 80.0  # a client process busier than this cannot be trusted to keep up
LATE_LIMIT_PCT = 5.0  # open loop: more late sends than this during warm-up means the client lags
CLIENT_NAME = "farm"  # which client measured a result (details "client"), beside its RPC (details "rpc")
SPAWN_TIMEOUT_S = 60.0  # worker processes must be connected and ready within this (plus connect timeout)
START_DELAY_S = 0.05  # margin between "go" and the shared start time (threads)
START_DELAY_PROC_S = 0.1  # the same for worker processes (each already reported Ready)


@dataclass
class LoadResult:
    """What one load run measured. ``metrics`` are keyed by ``schemas.metrics`` names (None: not measured);
    ``details`` hold the latency histogram, per-window series, error counts by gRPC status and the
    mode/rate/concurrency/process count used."""

    metrics: dict[str, float | int | bool | None]
    details: dict[str, Any] = field(default_factory=dict)


def auto_process_cap(cpu_count: int | None = None) -> int:
    """How many client processes the generator may spread over on its own: half the cores (the model
    server needs the rest), at most 8. On a 2-core machine that is 1: set ``processes`` to override."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, min(8, cores // 2))


def window_lengths(settings: MeasurementSettings) -> tuple[float, ...]:
    """The measurement windows in seconds: ``max_windows`` of ``window_s``, or ``duration_s`` cut into
    ``window_s`` pieces (the last one shorter when it does not divide)."""
    if settings.duration_s is None:
        return (settings.window_s,) * settings.max_windows
    full = int(settings.duration_s // settings.window_s)
    rest = settings.duration_s - full * settings.window_s
    lengths = [settings.window_s] * full
    if rest > 1e-6 * settings.window_s or not lengths:
        lengths.append(rest if lengths else settings.duration_s)
    return tuple(lengths)


def split_work(mode: str, concurrency: int, rate: float | None,
               processes: int) -> list[tuple[int, float | None, float]]:
    """Per process: (concurrency, rate, phase_s). Closed loop splits the outstanding requests as evenly
    as possible (never more processes than requests); open loop splits the rate, constant mode
    interleaving the processes' schedules so the sum is still evenly spaced."""
    if mode == "closed":
        n = max(1, min(processes, concurrency))
        return [(concurrency // n + (1 if i < concurrency % n else 0), None, 0.0) for i in range(n)]
    assert rate is not None
    n = max(1, processes)
    return [(concurrency, rate / n, i / rate) for i in range(n)]


def _summarize_window(k: int, t0: float, parts: list[WindowReport], batch_size: int) -> WindowSummary:
    """Merge window ``k`` of every worker (``parts`` by worker index); ``t0``: when measuring began."""
    lat = np.concatenate([p.samples.lat_ms for p in parts])
    errors = _sum_counts(p.samples.errors for p in parts)
    length = max(parts[0].t1 - parts[0].t0, 1e-9)
    p50, p99 = stats.percentiles(lat, (50, 99))
    return WindowSummary(
        k=k, t_s=parts[0].t0 - t0, length_s=length, requests=int(lat.size), errors=sum(errors.values()),
        requests_per_s=lat.size / length, throughput_infer_per_s=lat.size * batch_size / length,
        mean_ms=stats.mean(lat), p50_ms=p50, p99_ms=p99, lat_ms=lat,
        queue_ms=np.concatenate([p.samples.queue_ms for p in parts]),
        compute_ms=np.concatenate([p.samples.compute_ms for p in parts]), error_counts=errors,
        sent=sum(p.samples.sent for p in parts), late=sum(p.samples.late for p in parts),
        cpu_s=tuple(p.cpu_s for p in parts), wall_s=tuple(p.wall_s for p in parts),
        first_error=next((p.first_error for p in parts if p.first_error), None),
    )


def _sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Add error counts by status name (keys in first-seen order)."""
    total: dict[str, int] = {}
    for c in counts:
        for name, n in c.items():
            total[name] = total.get(name, 0) + n
    return total


def judge_stable(windows: Sequence[dict[str, Any]], settings: MeasurementSettings) -> bool:
    """The job's stability rule on a run's window summaries (``WindowSummary.public()`` form, as any client's
    windows are kept): the last ``min_windows`` agree within ``stability_pct`` (``stats.is_stable``)."""
    return stats.is_stable(windows, settings.min_windows, settings.stability_pct,
                           stats.stability_keys(settings.stability_latency))


def _is_stable(windows: list[WindowSummary], settings: MeasurementSettings) -> bool:
    return judge_stable([w.public() for w in windows], settings)


@dataclass
class _Outcome:
    windows: list[WindowSummary]
    warmups: list[WarmupReport]
    stopped_stable: bool
    escalate_to: int | None = None
    notes: list[str] = field(default_factory=list)
    first_error: str | None = None


def _wait_ready(driver: Driver, connect_timeout_s: float) -> None:
    """Wait until every worker reported Ready; raise LoadGenError on a worker error or after the timeout."""
    n = driver.n
    ready: set[int] = set()
    spawned = isinstance(driver, ProcessDriver)
    deadline = time.monotonic() + connect_timeout_s + (SPAWN_TIMEOUT_S if spawned else 5.0)
    while len(ready) < n:
        for i, msg in driver.recv(0.05):
            if isinstance(msg, WorkerError):
                raise LoadGenError(msg.text)
            if isinstance(msg, Ready):
                ready.add(i)
        if time.monotonic() > deadline:
            raise LoadGenError(f"{n - len(ready)} of {n} load workers did not become ready; check the "
                               f"server at {driver.configs[0].url} and that this machine can start processes")


class _Coordinator:
    """Follows the started workers of ``driver`` through warm-up and windows: merges each window once
    every worker reported it, stops them on stability, on nothing succeeding, on escalation or at the
    time limit."""

    def __init__(self, driver: Driver, settings: MeasurementSettings, batch_size: int, mode: str,
                 escalate_cap: int, concurrency: int, t_start: float) -> None:
        self.driver, self.settings, self.batch_size = driver, settings, batch_size
        self.mode, self.escalate_cap, self.concurrency = mode, escalate_cap, concurrency
        self.measure_start = t_start + settings.warmup_s
        self.hard_deadline = self.measure_start + sum(window_lengths(settings)) + 30.0
        self.time_limit = time.monotonic() + settings.timeout_s
        self.pending: dict[int, dict[int, WindowReport]] = {}  # window k -> worker index -> report
        self.warm: dict[int, WarmupReport] = {}
        self.done: set[int] = set()
        self.ok_so_far = 0
        self.out = _Outcome(windows=[], warmups=[], stopped_stable=False)

    def run(self) -> _Outcome:
        while len(self.done) < self.driver.n:
            for i, msg in self.driver.recv(0.05):
                self._receive(i, msg)
            self._merge_windows()
            self._check_time()
        return self.out

    def _receive(self, i: int, msg: WorkerMessage) -> None:
        if isinstance(msg, WorkerError):
            raise LoadGenError(msg.text)
        if isinstance(msg, WorkerDone):
            self.done.add(i)
            self.out.first_error = self.out.first_error or msg.first_error
        elif isinstance(msg, WarmupReport):
            self.warm[i] = msg
            if len(self.warm) == self.driver.n:
                self._warmed_up()
        elif isinstance(msg, WindowReport):
            self.pending.setdefault(msg.k, {})[i] = msg

    def _warmed_up(self) -> None:
        """Every worker finished its warm-up: stop to re-run with more processes when one was too busy."""
        out = self.out
        out.warmups = [self.warm[j] for j in range(self.driver.n)]
        self.ok_so_far += sum(w.ok for w in out.warmups)
        target = escalation(out.warmups, self.mode, self.concurrency, self.escalate_cap)
        if target is not None and self.settings.warmup_s >= 0.2:
            out.escalate_to = target
            self.driver.stop()

    def _merge_windows(self) -> None:
        """Merge every window all workers have reported, in order; stop once stable or nothing succeeded."""
        n, out, settings = self.driver.n, self.out, self.settings
        while len(self.pending.get(len(out.windows), {})) == n:
            k = len(out.windows)
            parts = self.pending.pop(k)
            out.windows.append(_summarize_window(k, self.measure_start, [parts[j] for j in range(n)],
                                                 self.batch_size))
            self.ok_so_far += out.windows[-1].requests
            if self.ok_so_far == 0:
                self.driver.stop()
            elif settings.duration_s is None and _is_stable(out.windows, settings):
                out.stopped_stable = True
                self.driver.stop()

    def _check_time(self) -> None:
        """Stop the workers at the job's time limit; raise when they hang well past the last window."""
        now = time.monotonic()
        if now > self.time_limit and len(self.done) < self.driver.n:
            self.out.notes.append(f"stopped at the job time limit ({self.settings.timeout_s:g} s)")
            self.time_limit = math.inf
            self.driver.stop()
        if now > self.hard_deadline:
            raise LoadGenError(f"load workers did not finish {self.hard_deadline - self.measure_start:.0f} s "
                               "after the measurement started; the client is hung: check the server and retry")


def _drive(driver: Driver, settings: MeasurementSettings, batch_size: int, mode: str,
           escalate_cap: int, concurrency: int, connect_timeout_s: float) -> _Outcome:
    """Run the workers of ``driver`` through warm-up and windows; stop on stability, errors or time."""
    _wait_ready(driver, connect_timeout_s)
    t_start = time.monotonic() + (START_DELAY_PROC_S if isinstance(driver, ProcessDriver) else START_DELAY_S)
    driver.go(t_start)
    return _Coordinator(driver, settings, batch_size, mode, escalate_cap, concurrency, t_start).run()


def escalation(warmups: list[WarmupReport], mode: str, concurrency: int, cap: int) -> int | None:
    """More processes when the (single) client process was too busy or sent late during warm-up."""
    if cap <= 1 or len(warmups) != 1 or (mode == "closed" and concurrency < 2):
        return None
    w = warmups[0]
    late_pct = 100.0 * w.late / w.sent if w.sent else 0.0
    busy = w.busy_pct
    if busy <= BUSY_LIMIT_PCT and (mode == "closed" or late_pct <= LATE_LIMIT_PCT):
        return None
    want = max(2, math.ceil(busy / (BUSY_LIMIT_PCT * 0.75)))
    if mode == "closed":
        want = min(want, concurrency)
    return min(want, cap)


@dataclass(frozen=True, slots=True)
class _Totals:
    """The run gathered once for its metrics and details: the windows the metrics use (``used``) and
    their samples and duration (s); over every window: error counts, sends, late sends, each process's
    CPU busy %, stability and the first error."""

    used: list[WindowSummary]
    lat: np.ndarray
    queue: np.ndarray
    compute: np.ndarray
    duration: float
    errors: dict[str, int]
    sent: int
    late: int
    busy_by_proc: list[float]
    stable: bool
    first_error: str | None


def _first_error(out: _Outcome) -> str | None:
    return out.first_error or next((w.first_error for w in out.windows if w.first_error), None)


def _no_success(out: _Outcome, settings: MeasurementSettings) -> LoadGenError:
    """The error for a run whose metric windows hold no successful request: what failed, what to check."""
    errors = _sum_counts([*(w.errors for w in out.warmups), *(w.error_counts for w in out.windows)])
    first = _first_error(out)
    counts = (", ".join(f"{k}: {v}" for k, v in sorted(errors.items()))
              or "no responses at all: the server may be hung or slower than one window")
    if settings.rpc == "stream" and "UNIMPLEMENTED" in errors:
        return LoadGenError(f"the server does not serve ModelStreamInfer streams (first error: {first}); "
                            "measure with --rpc unary")
    return LoadGenError(
        f"no request succeeded while measuring ({counts}; first error: {first or 'none'}); check the "
        "model name, the input names, dtypes and shapes (batch dimension excluded), and the server log")


def _totals(out: _Outcome, settings: MeasurementSettings, processes: int) -> _Totals:
    """Gather the run; raise LoadGenError when no window completed or no request succeeded."""
    wins = out.windows
    if not wins:
        raise LoadGenError("the run stopped before its first measurement window completed; raise "
                           "timeout_s or lower warmup_s/window_s")
    n_metric = len(wins) if settings.duration_s is not None else min(settings.min_windows, len(wins))
    used = wins[len(wins) - n_metric:]
    lat = np.concatenate([w.lat_ms for w in used])
    if lat.size == 0:
        raise _no_success(out, settings)
    busy_by_proc = [100.0 * sum(w.cpu_s[i] for w in wins) / max(sum(w.wall_s[i] for w in wins), 1e-9)
                    for i in range(processes)]
    return _Totals(
        used=used, lat=lat, queue=np.concatenate([w.queue_ms for w in used]),
        compute=np.concatenate([w.compute_ms for w in used]), duration=sum(w.length_s for w in used),
        errors=_sum_counts(w.error_counts for w in wins), sent=sum(w.sent for w in wins),
        late=sum(w.late for w in wins), busy_by_proc=busy_by_proc,
        stable=_is_stable(wins, settings), first_error=_first_error(out),
    )


def late_pct(t: _Totals, mode: str) -> float | None:
    """Open loop: the share (%) of sends that left late; None in closed loop."""
    return (100.0 * t.late / t.sent if t.sent else 0.0) if mode != "closed" else None


def _metrics(t: _Totals, batch_size: int, mode: str, windows: int) -> dict[str, float | int | bool | None]:
    """The run's metrics, keyed by ``schemas.metrics`` names. A client-limited run reports no latency
    (its end-to-end latencies stay in the details, ``client_limited_latency``)."""
    queue, compute = t.queue, t.compute
    late = late_pct(t, mode)
    latency = stats.latency_metrics(t.lat, batch_size, t.duration)
    if client_limited({"late_send_pct": late}):
        latency = {k: (None if k.startswith("latency_") else v) for k, v in latency.items()}
    return {
        **latency,
        "server_queue_p50_ms": stats.percentile(queue, 50) if queue.size else None,
        "server_compute_p50_ms": stats.percentile(compute, 50) if compute.size else None,
        "server_compute_p99_ms": stats.percentile(compute, 99) if compute.size else None,
        "error_count": int(sum(t.errors.values())),
        "late_send_pct": late,
        "client_busy_pct": max(t.busy_by_proc),
        "stable": bool(t.stable),
        "windows": windows,
        "duration_s": t.duration,
    }


def result_notes(t: _Totals, settings: MeasurementSettings, client: str, concurrency: int) -> list[str]:
    """The warnings any client's run gets from its totals: client-limited (open loop, over 1 % late sends),
    the client's own cost (closed loop; ``concurrency``: what one client process kept outstanding) and an
    unstable measurement."""
    notes = []
    late = late_pct(t, settings.mode)
    if client_limited({"late_send_pct": late}):
        notes.append(f"{late:.1f} % late sends; {CLIENT_LIMITED_NOTE} (its latency: details.client_limited_latency)")
    share = stats.client_share_note(max(t.busy_by_proc), concurrency, settings.mode, client)
    if share:
        notes.append(share)
    if not t.stable:
        notes.append(f"not stable: the last {settings.min_windows} windows did not agree within "
                     f"±{settings.stability_pct:g} % on throughput and {settings.stability_latency} latency")
    return notes


def _notes(out: _Outcome, t: _Totals, settings: MeasurementSettings, per_process: int) -> list[str]:
    """The coordinator's notes, a warning about a busy client process, then :func:`result_notes`
    (``per_process``: the concurrency each client process kept)."""
    notes = list(out.notes)
    if max(t.busy_by_proc) > BUSY_LIMIT_PCT:
        notes.append(f"load generator process was {max(t.busy_by_proc):.0f} % busy: the client may limit "
                     "the result; give it more processes (processes=) or cores")
    return notes + result_notes(t, settings, "farm's generator", per_process)


def _details(out: _Outcome, t: _Totals, settings: MeasurementSettings, batch_size: int, mode: str,
             concurrency: int, processes: int) -> dict[str, Any]:
    """Histograms, per-window figures, errors, warm-up counts, the client and the plan the run used."""
    limited = client_limited({"late_send_pct": late_pct(t, mode)})
    return {
        "client": CLIENT_NAME, "client_limited": limited, "mode": mode, "rpc": settings.rpc,
        "rate": settings.rate if mode != "closed" else None,
        "client_limited_latency": stats.latency_metrics(t.lat, batch_size, t.duration) if limited else None,
        "concurrency": concurrency,
        "batch_size": batch_size, "processes": processes,
        "warmup_s": settings.warmup_s, "window_s": settings.window_s,
        "metrics_windows": [t.used[0].k, t.used[-1].k],
        "stopped_when_stable": out.stopped_stable,
        "latency_histogram": stats.histogram(t.lat),
        "server_compute_histogram": stats.histogram(t.compute) if t.compute.size else None,
        "windows": [w.public() for w in out.windows],
        "errors": t.errors,
        "first_error": t.first_error,
        "warmup_requests": sum(w.ok for w in out.warmups),
        "warmup_errors": sum(sum(w.errors.values()) for w in out.warmups),
        "sent": t.sent, "late_sends": t.late,
        "client_busy_pct_by_process": t.busy_by_proc,
        "notes": _notes(out, t, settings, max(1, concurrency // processes)),
    }


def _result(out: _Outcome, settings: MeasurementSettings, batch_size: int, mode: str,
            concurrency: int, processes: int) -> LoadResult:
    """The LoadResult of a finished run; LoadGenError when it measured nothing."""
    t = _totals(out, settings, processes)
    return LoadResult(metrics=_metrics(t, batch_size, mode, len(out.windows)),
                      details=_details(out, t, settings, batch_size, mode, concurrency, processes))


def run_load(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, concurrency: int,
             settings: MeasurementSettings, *, processes: int | None = None,
             connect_timeout_s: float = 10.0, seed: int = 0, in_process: bool = False,
             data: InputData | None = None) -> LoadResult:
    """Drive the KServe v2 gRPC server at ``url`` (``host:port``) with inference requests for
    ``model_name`` and measure latency and throughput; ``settings.rpc`` picks unary ModelInfer calls or
    ModelStreamInfer streams; ``settings.client`` NVIDIA perf_analyzer (``workers.loadgen.perf_analyzer``),
    farm's own generator, or ``auto``: perf_analyzer where it can run the job, else farm's generator (the
    reason in the notes).

    Closed loop (``settings.mode == "closed"``): ``concurrency`` requests always outstanding, each a
    batch of ``batch_size``. Open loop (``constant``/``poisson``): ``settings.rate`` requests/s, latency
    counted from each request's scheduled send time. ``processes``: client processes to spread the load
    over (None: one, more only when it cannot keep up and ``auto_process_cap()`` allows). Every client
    process is one of its own, away from the caller's threads (a job's samplers, this coordinator) and
    their GIL; ``in_process`` runs a single one as a thread of this process instead (a daemonic caller,
    which may not start processes, always does). ``details["client_process"]`` says which.
    ``data``: which values the tensors hold (None: random; see ``request.input_tensor``); the result's
    details record it (``input_data``).
    Raises LoadGenError when the server is unreachable or no request succeeded.
    """
    if batch_size < 1 or concurrency < 1:
        raise LoadGenError(f"batch_size and concurrency must be >= 1, got {batch_size} and {concurrency}")
    from workers.loadgen import perf_analyzer

    max_batch, why_not_pa = perf_analyzer.choose(settings.client, url, model_name, settings.rpc)
    if max_batch is not None:
        try:
            result: LoadResult = perf_analyzer.run_perf_analyzer(url, model_name, list(inputs), batch_size,
                                                                 concurrency, settings, max_batch, data, seed)
            return result
        except LoadGenError as exc:  # auto: farm's generator measures instead, and says why
            if settings.client != "auto":
                raise
            why_not_pa = f"perf_analyzer failed ({exc})"
    if processes is not None and processes < 1:
        raise LoadGenError(f"processes must be >= 1 or None, got {processes}")
    mode = settings.mode
    try:
        request, *more = serialized_requests(model_name, list(inputs), batch_size, seed, data)
    except ValueError as exc:
        raise LoadGenError(f"cannot build the request: {exc}") from exc
    n_proc = processes or 1
    cap = auto_process_cap() if processes is None else 1
    notes = [f"measured by farm's own generator, not perf_analyzer: {why_not_pa}"] if settings.client == "auto" else []
    if mp.current_process().daemon and (n_proc > 1 or cap > 1):
        # a daemonic process (e.g. a Celery prefork child) may not start children
        notes.append(f"ran in one client process instead of {max(n_proc, cap)}: this process is daemonic "
                     "and cannot start worker processes")
        n_proc, cap = 1, 1
    while True:
        plan = split_work(mode, concurrency, settings.rate, n_proc)
        configs = [
            WorkerConfig(url=url, model_name=model_name, request=request, mode=mode, concurrency=c, rate=r,
                         phase_s=phase, warmup_s=settings.warmup_s, window_lengths_s=window_lengths(settings),
                         connect_timeout_s=connect_timeout_s, seed=seed + i, rpc=settings.rpc,
                         more_requests=tuple(more))
            for i, (c, r, phase) in enumerate(plan)
        ]
        threaded = len(configs) == 1 and (in_process or mp.current_process().daemon)
        with (ThreadDriver(configs) if threaded else ProcessDriver(configs)) as driver:
            out = _drive(driver, settings, batch_size, mode, cap, concurrency, connect_timeout_s)
        if out.escalate_to is None:
            break
        w = out.warmups[0]
        notes.append(f"one client process was {w.busy_pct:.0f} % busy ({w.late} of {w.sent} sends "
                     f"late) during warm-up; re-ran with {out.escalate_to} processes")
        n_proc, cap = out.escalate_to, 1
    if threaded and not grpc_env.EFFECTIVE:  # one client: it ran in this process
        notes.append(grpc_env.LATE_NOTE)
    result = _result(out, settings, batch_size, mode, concurrency, len(configs))
    result.details["client_process"] = "thread of the measuring process" if threaded else "own process"
    result.details["notes"] = notes + result.details["notes"]
    result.details["input_data"] = (data or InputData()).describe()
    return result

"""farm's own load client: plan the worker processes, drive them through the warm-up and windows, stop on
stability, and gather their reports into a :class:`~workers.loadgen.contract.LoadRecord`."""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from farm.errors import LoadGenError
from schemas import MeasurementSettings
from schemas.load import Histogram
from workers import grpc_env
from workers.loadgen import stats
from workers.loadgen.contract import ClientDetails, LoadClient, LoadJob, LoadRecord, RunTotals, WindowFigures
from workers.loadgen.drivers import Driver, ProcessDriver, ThreadDriver
from workers.loadgen.kserve.messages import (
    Ready,
    WarmupReport,
    WindowReport,
    WorkerDone,
    WorkerError,
    WorkerMessage,
)
from workers.loadgen.kserve.request import serialized_requests
from workers.loadgen.kserve.worker import WorkerConfig
from workers.loadgen.patterns import LoadPattern
from workers.loadgen.plan import WindowPlan
from workers.loadgen.result import judge_stable
from workers.loadgen.stops import Duration, NoSuccess, Progress, Stable, StopRule, end_s

BUSY_LIMIT_PCT = 80.0  # a client process busier than this cannot be trusted to keep up
LATE_LIMIT_PCT = 5.0  # open loop: more late sends than this during warm-up means the client lags
SPAWN_TIMEOUT_S = 60.0  # worker processes must be connected and ready within this (plus connect timeout)
START_DELAY_S = 0.05  # margin between "go" and the shared start time (threads)
START_DELAY_PROC_S = 0.1  # the same for worker processes (each already reported Ready)


def auto_process_cap(cpu_count: int | None = None) -> int:
    """How many client processes the generator may spread over on its own: half the cores (the model
    server needs the rest), at most 8. On a 2-core machine that is 1: set ``processes`` to override."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, min(8, cores // 2))


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """Window ``k`` merged over every worker: its public ``figures`` and what feeds the run's result: all
    samples (ms), error counts by status, sends, late sends, and each worker's CPU and wall seconds (by
    worker index)."""

    figures: WindowFigures
    lat_ms: np.ndarray
    queue_ms: np.ndarray
    compute_ms: np.ndarray
    error_counts: dict[str, int]
    sent: int
    late: int
    cpu_s: tuple[float, ...]
    wall_s: tuple[float, ...]
    first_error: str | None


@dataclass(frozen=True)
class FarmDetails(ClientDetails):
    """farm's generator's own details: the server's compute-time histogram (from its response parameters;
    None when it sent none), the first error's text and the warm-up's failed requests."""

    server_compute_histogram: Histogram | None
    first_error: str | None
    warmup_errors: int


def _summarize_window(k: int, t0: float, parts: list[WindowReport], batch_size: int) -> WindowSummary:
    """Merge window ``k`` of every worker (``parts`` by worker index); ``t0``: when measuring began."""
    lat = np.concatenate([p.samples.lat_ms for p in parts])
    errors = _sum_counts(p.samples.errors for p in parts)
    length = max(parts[0].t1 - parts[0].t0, 1e-9)
    return WindowSummary(
        figures=WindowFigures.measure(k, parts[0].t0 - t0, length, lat, sum(errors.values()), batch_size),
        lat_ms=lat, queue_ms=np.concatenate([p.samples.queue_ms for p in parts]),
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


def _is_stable(windows: list[WindowSummary], settings: MeasurementSettings) -> bool:
    return judge_stable([w.figures for w in windows], settings)


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


def stop_rules(job: LoadJob, plan: WindowPlan) -> tuple[StopRule, ...]:
    """When the gRPC client stops a job's run before its plan's end: once a window merged with nothing
    succeeded, once stable (a plan that runs until stable), at the job's time limit."""
    stable: tuple[StopRule, ...] = (Stable(job.settings),) if plan.until_stable else ()
    return (NoSuccess(), *stable, Duration(job.settings.timeout_s))


class _Coordinator:
    """Follows the started workers of ``driver`` through ``plan``'s warm-up and windows: merges each window
    once every worker reported it and asks the run's ``stop_rules`` then; stops them on escalation or at the
    rules' time limit (``escalate_cap``: the most processes it may ask for)."""

    def __init__(self, driver: Driver, job: LoadJob, plan: WindowPlan, escalate_cap: int, t_start: float) -> None:
        self.driver, self.job, self.plan, self.escalate_cap = driver, job, plan, escalate_cap
        self.t_start = t_start
        self.measure_start = t_start + plan.warmup_s
        self.hard_deadline = self.measure_start + plan.measured_s + 30.0
        self.rules = stop_rules(job, plan)
        self.time_limit = t_start + end_s(self.rules, math.inf)
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
        target = escalation(out.warmups, self.job.pattern, self.escalate_cap)
        if target is not None and self.plan.warmup_s >= 0.2:
            out.escalate_to = target
            self.driver.stop()

    def _merge_windows(self) -> None:
        """Merge every window all workers have reported, in order; stop once stable or nothing succeeded."""
        n, out = self.driver.n, self.out
        while len(self.pending.get(len(out.windows), {})) == n:
            k = len(out.windows)
            parts = self.pending.pop(k)
            out.windows.append(_summarize_window(k, self.measure_start, [parts[j] for j in range(n)],
                                                 self.job.batch_size))
            self.ok_so_far += out.windows[-1].figures.requests
            self._judge()

    def _judge(self) -> None:
        """Stop the workers when one of the run's rules says so (a stable run records it)."""
        progress = Progress(now=time.monotonic(), t_start=self.t_start, warmup_s=self.plan.warmup_s,
                            measured_done=sum(w.figures.requests for w in self.out.windows),
                            windows=[w.figures for w in self.out.windows], succeeded=self.ok_so_far)
        for rule in self.rules:
            if rule.should_stop(progress) is not None:
                self.out.stopped_stable = isinstance(rule, Stable)
                self.driver.stop()
                return

    def _check_time(self) -> None:
        """Stop the workers at the rules' time limit (the job's); raise when they hang well past the last window."""
        now = time.monotonic()
        if now > self.time_limit and len(self.done) < self.driver.n:
            self.out.notes.append(f"stopped at the job time limit ({self.job.settings.timeout_s:g} s)")
            self.time_limit = math.inf
            self.driver.stop()
        if now > self.hard_deadline:
            raise LoadGenError(f"load workers did not finish {self.hard_deadline - self.measure_start:.0f} s "
                               "after the measurement started; the client is hung: check the server and retry")


def _drive(driver: Driver, job: LoadJob, plan: WindowPlan, escalate_cap: int) -> _Outcome:
    """Run the workers of ``driver`` through warm-up and windows; stop on stability, errors or time."""
    _wait_ready(driver, job.connect_timeout_s)
    t_start = time.monotonic() + (START_DELAY_PROC_S if isinstance(driver, ProcessDriver) else START_DELAY_S)
    driver.go(t_start)
    return _Coordinator(driver, job, plan, escalate_cap, t_start).run()


def escalation(warmups: list[WarmupReport], pattern: LoadPattern, cap: int) -> int | None:
    """More processes when the (single) client process was too busy or, where sends have a schedule, sent
    late during warm-up; at most ``cap`` and what ``pattern`` can use."""
    limit = pattern.max_processes(cap)
    if limit <= 1 or len(warmups) != 1:
        return None
    w = warmups[0]
    late = pattern.late_pct(w.sent, w.late)
    if w.busy_pct <= BUSY_LIMIT_PCT and (late is None or late <= LATE_LIMIT_PCT):
        return None
    return min(max(2, math.ceil(w.busy_pct / (BUSY_LIMIT_PCT * 0.75))), limit)


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


def _totals(out: _Outcome, job: LoadJob, used: slice, processes: int) -> RunTotals:
    """Gather the run (``used``: the windows the metrics use); raise LoadGenError when no window completed
    or no request succeeded."""
    wins = out.windows
    metric = wins[used]
    lat = np.concatenate([w.lat_ms for w in metric])
    if lat.size == 0:
        raise _no_success(out, job.settings)
    busy_by_proc = [100.0 * sum(w.cpu_s[i] for w in wins) / max(sum(w.wall_s[i] for w in wins), 1e-9)
                    for i in range(processes)]
    return RunTotals(
        lat_ms=lat, queue_ms=np.concatenate([w.queue_ms for w in metric]),
        compute_ms=np.concatenate([w.compute_ms for w in metric]),
        duration_s=sum(w.figures.length_s for w in metric), errors=_sum_counts(w.error_counts for w in wins),
        sent=sum(w.sent for w in wins), late=sum(w.late for w in wins), busy_by_process=busy_by_proc,
        stable=_is_stable(wins, job.settings),
    )


class FarmClient(LoadClient):
    """farm's own generator: KServe v2 gRPC, unary ModelInfer calls or ModelStreamInfer streams, from one
    client process of its own (more when one cannot keep up and ``auto_process_cap()`` allows, or as
    ``job.processes`` says), away from the caller's threads (a job's samplers, this coordinator) and their
    GIL; ``job.in_process`` runs a single one as a thread of this process instead (a daemonic caller, which
    may not start processes, always does)."""

    name = "farm"
    label = "farm's generator"
    title = "farm's own generator"
    stops_when_stable = True

    def run(self, job: LoadJob, plan: WindowPlan) -> LoadRecord:
        if job.processes is not None and job.processes < 1:
            raise LoadGenError(f"processes must be >= 1 or None, got {job.processes}")
        try:
            request, *more = serialized_requests(job.model_name, list(job.inputs), job.batch_size, job.seed,
                                                 job.data)
        except ValueError as exc:
            raise LoadGenError(f"cannot build the request: {exc}") from exc
        n_proc = job.processes or 1
        cap = auto_process_cap() if job.processes is None else 1
        notes: list[str] = []
        if mp.current_process().daemon and (n_proc > 1 or cap > 1):
            # a daemonic process (e.g. a Celery prefork child) may not start children
            notes.append(f"ran in one client process instead of {max(n_proc, cap)}: this process is daemonic "
                         "and cannot start worker processes")
            n_proc, cap = 1, 1
        while True:
            # an endpoint job's cap on requests in flight, shared among its client processes
            outstanding = WorkerConfig.max_outstanding if job.in_flight_cap is None else -(-job.in_flight_cap // n_proc)
            configs = [
                WorkerConfig(url=job.url, model_name=job.model_name, request=request, pattern=share, plan=plan,
                             connect_timeout_s=job.connect_timeout_s, seed=job.seed + i, rpc=job.settings.rpc,
                             more_requests=tuple(more), max_outstanding=outstanding)
                for i, share in enumerate(job.pattern.split(n_proc))
            ]
            threaded = len(configs) == 1 and (job.in_process or mp.current_process().daemon)
            with (ThreadDriver(configs) if threaded else ProcessDriver(configs)) as driver:
                out = _drive(driver, job, plan, cap)
            if out.escalate_to is None:
                break
            w = out.warmups[0]
            notes.append(f"one client process was {w.busy_pct:.0f} % busy ({w.late} of {w.sent} sends "
                         f"late) during warm-up; re-ran with {out.escalate_to} processes")
            n_proc, cap = out.escalate_to, 1
        if threaded and not grpc_env.EFFECTIVE:  # one client: it ran in this process
            notes.append(grpc_env.LATE_NOTE)
        return _record(out, job, plan, len(configs), notes,
                       "thread of the measuring process" if threaded else "own process")


def _record(out: _Outcome, job: LoadJob, plan: WindowPlan, processes: int, notes: list[str],
            where: str) -> LoadRecord:
    """The record of a finished run (``where``: the client process); LoadGenError when it measured nothing."""
    if not out.windows:
        raise LoadGenError("the run stopped before its first measurement window completed; raise "
                           "timeout_s or lower warmup_s/window_s")
    used = plan.metric_windows(len(out.windows))
    t = _totals(out, job, used, processes)
    notes = [*notes, *out.notes]
    if max(t.busy_by_process) > BUSY_LIMIT_PCT:
        notes.append(f"load generator process was {max(t.busy_by_process):.0f} % busy: the client may limit "
                     "the result; give it more processes (processes=) or cores")
    own = FarmDetails(server_compute_histogram=stats.histogram(t.compute_ms) if t.compute_ms.size else None,
                      first_error=_first_error(out), warmup_errors=sum(sum(w.errors.values()) for w in out.warmups))
    return LoadRecord(client=FarmClient.name, label=FarmClient.label, client_process=where, rpc=job.settings.rpc,
                      processes=processes, windows=[w.figures for w in out.windows], metric_windows=used, totals=t,
                      stopped_when_stable=out.stopped_stable, warmup_requests=sum(w.ok for w in out.warmups),
                      notes=notes, own=own)

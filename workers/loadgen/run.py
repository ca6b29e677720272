"""The coordinator: plan the workers, drive the warm-up and windows, decide stability, build the result."""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from farm.errors import LoadGenError
from schemas import MeasurementSettings, TensorSpec
from workers import grpc_env
from workers.loadgen import stats
from workers.loadgen.drivers import Driver, ProcessDriver, ThreadDriver
from workers.loadgen.request import serialized_request
from workers.loadgen.worker import WorkerConfig

BUSY_LIMIT_PCT = 80.0  # a client process busier than this cannot be trusted to keep up
LATE_LIMIT_PCT = 5.0  # open loop: more late sends than this during warm-up means the client lags
SPAWN_TIMEOUT_S = 60.0  # worker processes must be connected and ready within this (plus connect timeout)
START_DELAY_S = 0.05  # margin between "go" and the shared start time (threads)
START_DELAY_PROC_S = 0.25  # the same for worker processes


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


def _summarize_window(k: int, t0: float, parts: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    lat = np.concatenate([p["lat_ms"] for p in parts])
    errors: dict[str, int] = {}
    for p in parts:
        for name, c in p["errors"].items():
            errors[name] = errors.get(name, 0) + c
    length = max(parts[0]["t1"] - parts[0]["t0"], 1e-9)
    p50, p99 = stats.percentiles(lat, (50, 99))
    return {
        "k": k, "t_s": parts[0]["t0"] - t0, "length_s": length,
        "requests": int(lat.size), "errors": sum(errors.values()),
        "requests_per_s": lat.size / length, "throughput_infer_per_s": lat.size * batch_size / length,
        "p50_ms": p50, "p99_ms": p99,
        "_lat": lat, "_queue": np.concatenate([p["queue_ms"] for p in parts]),
        "_compute": np.concatenate([p["compute_ms"] for p in parts]), "_errors": errors,
        "_sent": sum(p["sent"] for p in parts), "_late": sum(p["late"] for p in parts),
        "_cpu": [p["cpu_s"] for p in parts], "_wall": [p["wall_s"] for p in parts],
        "_first_error": next((p["first_error"] for p in parts if p["first_error"]), None),
    }


@dataclass
class _Outcome:
    windows: list[dict[str, Any]]
    warmups: list[dict[str, Any]]
    stopped_stable: bool
    escalate_to: int | None = None
    notes: list[str] = field(default_factory=list)
    first_error: str | None = None


def _drive(driver: Driver, settings: MeasurementSettings, batch_size: int, mode: str,
           escalate_cap: int, concurrency: int, connect_timeout_s: float) -> _Outcome:
    """Run the workers of ``driver`` through warm-up and windows; stop on stability, errors or time."""
    n = driver.n
    lengths = window_lengths(settings)
    ready: set[int] = set()
    deadline = time.monotonic() + connect_timeout_s + (SPAWN_TIMEOUT_S if n > 1 else 5.0)
    while len(ready) < n:
        for i, msg in driver.recv(0.05):
            if msg[0] == "error":
                raise LoadGenError(msg[1])
            if msg[0] == "ready":
                ready.add(i)
        if time.monotonic() > deadline:
            raise LoadGenError(f"{n - len(ready)} of {n} load workers did not become ready; check the "
                               f"server at {driver.configs[0].url} and that this machine can start processes")
    t_start = time.monotonic() + (START_DELAY_PROC_S if n > 1 else START_DELAY_S)
    driver.go(t_start)
    measure_start = t_start + settings.warmup_s
    hard_deadline = measure_start + sum(lengths) + 30.0
    time_limit = time.monotonic() + settings.timeout_s
    pending: dict[int, dict[int, dict[str, Any]]] = {}
    out = _Outcome(windows=[], warmups=[], stopped_stable=False)
    warm: dict[int, dict[str, Any]] = {}
    done: set[int] = set()
    ok_so_far = 0
    while len(done) < n:
        for i, msg in driver.recv(0.05):
            kind = msg[0]
            if kind == "error":
                raise LoadGenError(msg[1])
            if kind == "done":
                done.add(i)
                out.first_error = out.first_error or msg[1].get("first_error")
            elif kind == "warmup":
                warm[i] = msg[1]
                if len(warm) == n:
                    out.warmups = [warm[j] for j in range(n)]
                    ok_so_far += sum(w["ok"] for w in out.warmups)
                    target = escalation(out.warmups, mode, concurrency, escalate_cap)
                    if target is not None and settings.warmup_s >= 0.2:
                        out.escalate_to = target
                        driver.stop()
            elif kind == "window":
                pending.setdefault(msg[1], {})[i] = msg[2]
        # merge every window all workers have reported, in order
        while len(pending.get(len(out.windows), {})) == n:
            k = len(out.windows)
            parts = pending.pop(k)
            out.windows.append(_summarize_window(k, measure_start, [parts[j] for j in range(n)], batch_size))
            ok_so_far += out.windows[-1]["requests"]
            if ok_so_far == 0:
                driver.stop()
            elif settings.duration_s is None and stats.is_stable(out.windows, settings.min_windows,
                                                                 settings.stability_pct):
                out.stopped_stable = True
                driver.stop()
        now = time.monotonic()
        if now > time_limit and len(done) < n:
            out.notes.append(f"stopped at the job time limit ({settings.timeout_s:g} s)")
            time_limit = math.inf
            driver.stop()
        if now > hard_deadline:
            raise LoadGenError(f"load workers did not finish {hard_deadline - measure_start:.0f} s after the "
                               "measurement started; the client is hung: check the server and retry")
    return out


def escalation(warmups: list[dict[str, Any]], mode: str, concurrency: int, cap: int) -> int | None:
    """More processes when the (single) client process was too busy or sent late during warm-up."""
    if cap <= 1 or len(warmups) != 1 or (mode == "closed" and concurrency < 2):
        return None
    w = warmups[0]
    late_pct = 100.0 * w["late"] / w["sent"] if w["sent"] else 0.0
    busy = w["busy_pct"]
    if busy <= BUSY_LIMIT_PCT and (mode == "closed" or late_pct <= LATE_LIMIT_PCT):
        return None
    want = max(2, math.ceil(busy / (BUSY_LIMIT_PCT * 0.75)))
    if mode == "closed":
        want = min(want, concurrency)
    return min(want, cap)


def _result(out: _Outcome, settings: MeasurementSettings, batch_size: int, mode: str,
            concurrency: int, processes: int) -> LoadResult:
    wins = out.windows
    if not wins:
        raise LoadGenError("the run stopped before its first measurement window completed; raise "
                           "timeout_s or lower warmup_s/window_s")
    n_metric = len(wins) if settings.duration_s is not None else min(settings.min_windows, len(wins))
    used = wins[len(wins) - n_metric:]
    lat = np.concatenate([w["_lat"] for w in used])
    if lat.size == 0:
        errors: dict[str, int] = {}
        for w in [*out.warmups, *wins]:
            for name, c in (w.get("_errors") or w.get("errors") or {}).items():
                errors[name] = errors.get(name, 0) + c
        first = out.first_error or next((w["_first_error"] for w in wins if w["_first_error"]), None)
        counts = (", ".join(f"{k}: {v}" for k, v in sorted(errors.items()))
                  or "no responses at all: the server may be hung or slower than one window")
        if settings.rpc == "stream" and "UNIMPLEMENTED" in errors:
            raise LoadGenError(f"the server does not serve ModelStreamInfer streams (first error: {first}); "
                               "measure with --rpc unary")
        raise LoadGenError(
            f"no request succeeded while measuring ({counts}; first error: {first or 'none'}); check the "
            "model name, the input names, dtypes and shapes (batch dimension excluded), and the server log")
    duration = sum(w["length_s"] for w in used)
    queue = np.concatenate([w["_queue"] for w in used])
    compute = np.concatenate([w["_compute"] for w in used])
    s = stats.summarize_latencies(lat)
    errors = {}
    for w in wins:
        for name, c in w["_errors"].items():
            errors[name] = errors.get(name, 0) + c
    sent = sum(w["_sent"] for w in wins)
    late = sum(w["_late"] for w in wins)
    busy_by_proc = [100.0 * sum(w["_cpu"][i] for w in wins) / max(sum(w["_wall"][i] for w in wins), 1e-9)
                    for i in range(processes)]
    stable = stats.is_stable(wins, settings.min_windows, settings.stability_pct)
    metrics: dict[str, float | int | bool | None] = {
        "throughput_infer_per_s": lat.size * batch_size / duration,
        "requests_per_s": lat.size / duration,
        "latency_mean_ms": s["mean"], "latency_p50_ms": s["p50"], "latency_p90_ms": s["p90"],
        "latency_p95_ms": s["p95"], "latency_p99_ms": s["p99"], "latency_p999_ms": s["p999"],
        "latency_max_ms": s["max"], "latency_std_ms": s["std"],
        "server_queue_p50_ms": stats.percentile(queue, 50) if queue.size else None,
        "server_compute_p50_ms": stats.percentile(compute, 50) if compute.size else None,
        "server_compute_p99_ms": stats.percentile(compute, 99) if compute.size else None,
        "error_count": int(sum(errors.values())),
        "late_send_pct": (100.0 * late / sent if sent else 0.0) if mode != "closed" else None,
        "client_busy_pct": max(busy_by_proc),
        "stable": bool(stable),
        "windows": len(wins),
        "duration_s": duration,
    }
    notes = list(out.notes)
    if max(busy_by_proc) > BUSY_LIMIT_PCT:
        notes.append(f"load generator process was {max(busy_by_proc):.0f} % busy: the client may limit "
                     "the result; give it more processes (processes=) or cores")
    if not stable:
        notes.append(f"not stable: the last {settings.min_windows} windows did not agree within "
                     f"±{settings.stability_pct:g} % on throughput and p99")
    details: dict[str, Any] = {
        "mode": mode, "rpc": settings.rpc, "rate": settings.rate if mode != "closed" else None,
        "concurrency": concurrency,
        "batch_size": batch_size, "processes": processes,
        "warmup_s": settings.warmup_s, "window_s": settings.window_s,
        "metrics_windows": [used[0]["k"], used[-1]["k"]],
        "stopped_when_stable": out.stopped_stable,
        "latency_histogram": stats.histogram(lat),
        "server_compute_histogram": stats.histogram(compute) if compute.size else None,
        "windows": [{k: v for k, v in w.items() if not k.startswith("_")} for w in wins],
        "errors": errors,
        "first_error": out.first_error or next((w["_first_error"] for w in wins if w["_first_error"]), None),
        "warmup_requests": sum(w["ok"] for w in out.warmups),
        "warmup_errors": sum(sum(w["errors"].values()) for w in out.warmups),
        "sent": sent, "late_sends": late,
        "client_busy_pct_by_process": busy_by_proc,
        "notes": notes,
    }
    return LoadResult(metrics=metrics, details=details)


def run_load(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, concurrency: int,
             settings: MeasurementSettings, *, processes: int | None = None,
             connect_timeout_s: float = 10.0, seed: int = 0) -> LoadResult:
    """Drive the KServe v2 gRPC server at ``url`` (``host:port``) with inference requests for
    ``model_name`` and measure latency and throughput; ``settings.rpc`` picks unary ModelInfer calls or
    ModelStreamInfer streams.

    Closed loop (``settings.mode == "closed"``): ``concurrency`` requests always outstanding, each a
    batch of ``batch_size``. Open loop (``constant``/``poisson``): ``settings.rate`` requests/s, latency
    counted from each request's scheduled send time. ``processes``: client processes to spread the load
    over (None: one, more only when it cannot keep up and ``auto_process_cap()`` allows).
    Raises LoadGenError when the server is unreachable or no request succeeded.
    """
    if batch_size < 1 or concurrency < 1:
        raise LoadGenError(f"batch_size and concurrency must be >= 1, got {batch_size} and {concurrency}")
    if processes is not None and processes < 1:
        raise LoadGenError(f"processes must be >= 1 or None, got {processes}")
    mode = settings.mode
    try:
        request = serialized_request(model_name, list(inputs), batch_size, seed)
    except ValueError as exc:
        raise LoadGenError(f"cannot build the request: {exc}") from exc
    n_proc = processes or 1
    cap = auto_process_cap() if processes is None else 1
    notes: list[str] = []
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
                         connect_timeout_s=connect_timeout_s, seed=seed + i, rpc=settings.rpc)
            for i, (c, r, phase) in enumerate(plan)
        ]
        with (ThreadDriver(configs) if len(configs) == 1 else ProcessDriver(configs)) as driver:
            out = _drive(driver, settings, batch_size, mode, cap, concurrency, connect_timeout_s)
        if out.escalate_to is None:
            break
        w = out.warmups[0]
        notes.append(f"one client process was {w['busy_pct']:.0f} % busy ({w['late']} of {w['sent']} sends "
                     f"late) during warm-up; re-ran with {out.escalate_to} processes")
        n_proc, cap = out.escalate_to, 1
    if len(configs) == 1 and not grpc_env.EFFECTIVE:  # one client: it ran in this process
        notes.append(grpc_env.LATE_NOTE)
    result = _result(out, settings, batch_size, mode, concurrency, len(configs))
    result.details["notes"] = notes + result.details["notes"]
    return result

"""One op-profiling pass, in this process: the model's plain compute time, then its profiled run, summarized
into ``schemas.op_profile.OpProfile``.

The pass loads the model twice with the job's engine, device, batch and threads: once plainly (``warmup``
inferences, then ``iterations`` timed: the engine's compute time per inference, no profiler) and once with
the engine's profiler on (its own warm-up, then ``iterations`` profiled). It runs where it is started: the
job's leased cores (``workers.profiling.job``) or inside an edge run's limits (``workers.edge_bench``).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import numpy as np

from farm.peaks import Peak, gpu_peak, measure_cpu_peak
from schemas.cpus import cpu_list
from schemas.input_data import InputData
from schemas.op_profile import OpNode, OpProfile, missing
from workers.engines.backends import make_backend
from workers.engines.base import parse_device
from workers.engines.inputs import make_inputs
from workers.profiling.collect import Collected, profiler_for, timed


def _feed(backend: Any, inputs: list[dict[str, Any]] | None, batch_size: int,
          data: InputData | None) -> dict[str, np.ndarray]:
    return make_inputs(backend.inputs(), inputs, batch_size, data=data)


def run_pass(model: Path, engine: str, batch_size: int, threads: int, workdir: Path, *,
             inputs: list[dict[str, Any]] | None = None, device: str = "cpu", data: InputData | None = None,
             warmup: int = 5, iterations: int = 20, max_events: int = 200_000,
             compute_ms: float | None = None) -> tuple[OpProfile, Path | None]:
    """Profile ``model`` on ``engine``; returns the profile and the raw trace file (None: none was written).
    ``compute_ms``: the engine call's time measured already in this box (an edge run's p50): then the model is
    loaded once, profiled only (a memory-limited box holds one copy). An engine without a profiler gives a
    ``none`` profile; a crash propagates (the caller records it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    profiler = profiler_for(engine, model, workdir, warmup, max_events)
    if profiler is None:
        return missing(engine, "none", f"engine {engine} has no op profiler in farm"), None
    compute: list[float] = [compute_ms] if compute_ms is not None else []
    before = device_peak(device, threads)  # before any engine's threads exist, and again after they are gone
    with make_backend(engine) as plain, make_backend(engine) as backend:
        profiler.prepare(backend)
        backend.load(model, device, threads)
        feed = _feed(backend, inputs, batch_size, data)
        if compute_ms is None:
            plain.load(model, device, threads)
            timed(plain, feed, warmup)
        for _ in range(warmup):
            profiler.profiled(backend, feed)
        for _ in range(iterations):  # interleaved: a drift of the host's speed reaches both figures alike
            if compute_ms is None:
                compute += timed(plain, feed, 1)
            profiler.profiled(backend, feed)
        col = profiler.finish(backend)
        cores = thread_cpus()  # the engines' pools are still alive here
    prof = summarize(engine, col, compute, batch_size=batch_size, threads=threads, warmup=warmup)
    peak = best_of(before, device_peak(device, threads)) if prof.status == "ok" else None
    return prof.model_copy(update={"cpus": cpu_list(cores), "peak_gflops": peak.gflops if peak else None,
                                   "peak_source": peak.source if peak else None,
                                   "site": f"host {socket.gethostname()}, pid {os.getpid()}"}), col.trace


def best_of(a: Peak | None, b: Peak | None) -> Peak | None:
    """The higher of two measurements of the peak, its source saying both were taken (a GPU's: the table's)."""
    if a is None or b is None or a == b:  # a GPU's datasheet figure twice: one
        return a or b
    top = a if a.gflops >= b.gflops else b
    return Peak(top.gflops, f"{top.source}; the best of two such runs, before and after the profiled inferences "
                            f"({a.gflops:.1f} and {b.gflops:.1f} GFLOP/s)")


def device_peak(device: str, threads: int) -> Peak | None:
    """The peak FLOP rate of the pass's device (``farm.peaks``): a GPU's datasheet figure by its NVML name
    (None: a GPU the table does not know, or NVML absent), else measured on this process's cores with the pass's
    threads (0: one per core), after the profiled inferences, under the same limits."""
    if parse_device(device)[0] == "gpu":
        from workers.hardware import detect_gpus, gpu_uuids_for  # noqa: PLC0415 - NVML only for a GPU pass

        gpus = detect_gpus()
        uuids = gpu_uuids_for(gpus, device)
        name = next((g.name for g in gpus if uuids and g.uuid == uuids[0]), None)
        return gpu_peak(name) if name else None
    mine = os.sched_getaffinity(0)
    return measure_cpu_peak(threads or len(mine), cpu_list(mine))


def thread_cpus() -> set[int]:
    """The union of the cores every thread of this process may run on (``/proc/self/task``): a thread of the
    pass outside the job's cores would show here."""
    cores: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            cores |= os.sched_getaffinity(int(task.name))
        except OSError:  # the thread ended meanwhile
            continue
    return cores


def summarize(engine: str, col: Collected, compute_ms: list[float], *, batch_size: int, threads: int,
              warmup: int) -> OpProfile:
    """The profile of ``col``: per node, median and p90 self time per inference over the iterations read (an
    iteration in which a node did not run counts 0), calls per inference, share of the node sum; nodes with
    time first (largest first), zero-time nodes last; the overhead = compute - node sum, never spread."""
    n = col.iterations
    reasons = [col.note] if col.note else []
    if col.capped:
        reasons.insert(0, f"capped: the trace held more than the event bound; {n} of the iterations were read")
    if n == 0:
        return missing(engine, "failed", "; ".join(reasons) or "the profiler recorded no inference")
    nodes = []
    for name, acc in col.nodes.items():
        ms = np.array([acc.per_iter.get(i, 0.0) for i in range(n)]) / 1000.0
        nodes.append(OpNode(name=name, op_type=acc.op_type, exec_type=acc.exec_type, provider=acc.provider,
                            calls=round(acc.calls / n, 3), self_ms_p50=float(np.median(ms)),
                            self_ms_p90=float(np.percentile(ms, 90)), input_shapes=acc.shapes[:500],
                            fused=acc.fused, status=acc.status))  # type: ignore[arg-type]
    rows_sum = sum(x.self_ms_p50 for x in nodes)
    for x in nodes:
        x.share = x.self_ms_p50 / rows_sum if rows_sum > 0 else 0.0
    # the per-inference node sum as its median over iterations: like for like with the compute time's median
    # (a sum of per-node medians drops each node's preemptions and reads low on a busy host)
    node_sum = float(np.median([sum(a.per_iter.get(i, 0.0) for a in col.nodes.values()) for i in range(n)])) / 1000
    nodes.sort(key=lambda x: (x.self_ms_p50 <= 0, -x.self_ms_p50, x.name))
    compute = float(np.median(compute_ms))
    return OpProfile(engine=engine, status="ok", reason="; ".join(reasons) or None, batch_size=batch_size,
                     threads=threads, warmup=warmup, iterations=n, events=col.events, capped=col.capped,
                     node_sum_ms=node_sum, compute_ms=compute, profiled_ms=float(np.median(col.walls_ms)),
                     overhead_ms=compute - node_sum, trace_format="chrome" if col.trace else None, nodes=nodes)

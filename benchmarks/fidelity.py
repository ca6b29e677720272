"""Does farm measure what the model costs? Server-side compute vs in-process, end-to-end vs the parts.

A chain of MatMuls sized to take ~5 ms per request single-threaded (calibrated here), served by farm's
built-in server with 1 intra-op thread, driven by farm's generator in closed loop, concurrency 1:

1. server compute p50 (``farm_compute_ns``) vs ``InferenceSession.run`` p50 in-process with the same
   thread count on the same CPU (target: within 5 %), run back to back (before and after the server
   run) and, as a second reference, with the server's idle time before each run: a server at
   concurrency 1 idles while each answer travels, and on a VM an idle CPU comes back slower;
2. end-to-end p50 vs server compute p50 + the round trip of an identity model with the same tensor
   sizes (target: within 5 %).

The server runs and the in-process references alternate in rounds (5, quick 2), and each figure is the
median of the rounds' ratios, so a host whose speed drifts over a minute moves both sides of a ratio
alike. Leases (``--leases 1,2``): a 1-core lease (the server on core 0, 1 intra-op thread, the client on the
other cores) and a 2-core lease (the server on cores 0-1 with 2 threads; on a 2-core host the client shares
them, idle while the server computes at concurrency 1); the in-process reference runs on the same cores with
the same thread count. Each round also reads the host yardstick (``workers/samplers/calibrate.py``) on the
server's cores, printed beside the figures.

3. Co-location (``--colocate``): two jobs, each on its own core (server and client, as farm leases one core per
job on a 2-core host with 2 slots), measured alone and then both at once, in rounds; each job's server compute
p50 together vs alone (target: within 10 %, or flagged), with the foreign load on its core while both ran
(busy time of the core less the job's own server and client: ``samplers.foreign``), flagged "host busy" above
``FARM_HOST_BUSY_PCT`` (10 %), as a farm job's row would be.

Run: ``python benchmarks/fidelity.py [--quick] [--rounds N] [--leases 1,2] [--colocate/--no-colocate]``.
Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import numpy as np
import psutil
from _serve import Steal, farm_server_pid, identity_model, matmul_chain_model, pin, steal_flag  # noqa: I001

from schemas import MeasurementSettings, TensorSpec
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.loadgen.drivers import load_process_pids
from workers.samplers.calibrate import calibrate as yardstick
from workers.samplers.foreign import ForeignLoadSampler, ProcessesCpu, job_cpu_s
from workers.samplers.process import ProcessTreeSampler

BUSY_PCT = float(os.environ.get("FARM_HOST_BUSY_PCT", "10"))  # farm's "host busy" bound
CORES = sorted(os.sched_getaffinity(0))  # this host's cores, read before anything pins this thread
TARGET_MS = 5.0


def session(model: Path, threads: int):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def inprocess_p50(model: Path, dim: int, threads: int, runs: int, gap_s: float = 0.0) -> float:
    """p50 in ms of ``InferenceSession.run`` on a [1, dim, dim] input, after 20 warm-up runs;
    ``gap_s``: idle time before each run (a server at concurrency 1 idles for the round trip between
    requests, and on a VM an idle CPU comes back slower: cold caches, a vCPU to wake)."""
    return inprocess_times(model, dim, threads, runs, gap_s)[0]


def inprocess_times(model: Path, dim: int, threads: int, runs: int, gap_s: float = 0.0) -> tuple[float, float]:
    """(wall p50, CPU p50) in ms of ``InferenceSession.run`` (:func:`inprocess_p50`); the CPU time is this
    process's (every ORT thread): where wall >> CPU, the run was kept off its cores (preempted by other
    processes on a loaded host), which a server idling between requests suffers less from."""
    sess = session(model, threads)
    x = np.random.default_rng(0).random((1, dim, dim), dtype=np.float32)
    for _ in range(20):
        sess.run(None, {"x": x})
    times, cpu = [], []
    for _ in range(runs):
        if gap_s:
            time.sleep(gap_s)
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        sess.run(None, {"x": x})
        times.append((time.perf_counter_ns() - t0) / 1e6)
        cpu.append((time.process_time_ns() - c0) / 1e6)
    return float(np.percentile(times, 50)), float(np.percentile(cpu, 50))


def calibrate(tmp: Path, dim: int, threads: int) -> tuple[Path, int]:
    """A MatMul chain whose single request takes about TARGET_MS in-process."""
    one = inprocess_p50(matmul_chain_model(tmp / "one.onnx", 1, dim), dim, threads, 50)
    layers = max(1, round(TARGET_MS / one))
    return matmul_chain_model(tmp / f"chain{layers}.onnx", layers, dim), layers


def measure(url: str, dim: int, warmup: float, duration: float, pid: int | None = None) -> dict[str, float]:
    """farm's own generator at concurrency 1 (it reads the server's per-request compute time; perf_analyzer gets
    averages only); with the server's ``pid``, also its CPU time per request (``server_cpu_ms``: every thread,
    gRPC handling included; warm-up and windows, the requests of both)."""
    settings = MeasurementSettings(client="farm", warmup_s=warmup, window_s=1.0, duration_s=duration)
    proc = psutil.Process(pid) if pid else None
    cpu0 = sum(proc.cpu_times()[:2]) if proc else 0.0
    r = run_load(LoadTarget(url, "model"),
                 LoadSpec.from_settings([TensorSpec(name="x", shape=(dim, dim))], 1, 1, settings), processes=1)
    out = {k: v for k, v in r.metrics.items() if isinstance(v, float)}
    if proc is not None:
        requests = r.details["warmup_requests"] + sum(w["requests"] for w in r.details["windows"])
        out["server_cpu_ms"] = (sum(proc.cpu_times()[:2]) - cpu0) / max(requests, 1) * 1e3
    return out


def one_round(urls: tuple[str, str], model: Path, cpus: tuple[set[int] | None, set[int] | None],
              args: argparse.Namespace, warmup: float, duration: float, runs: int) -> dict[str, float]:
    """One round: the model's server under load, the in-process references on the server's CPU (back to
    back, and with the server's idle gap before each run), then the identity server's round trip.
    Doing all of them within one round, round after round, keeps the host's drift out of the ratios."""
    client_cpus, server_cpus = cpus
    speed = yardstick(server_cpus or {0}).speed
    pin(client_cpus)
    with Steal() as st:
        m = measure(urls[0], args.dim, warmup, duration, args.server_pid)
        pin(server_cpus)
        gap_s = max(0.0, m["latency_p50_ms"] - m["server_compute_p50_ms"]) / 1e3
        ref, ref_cpu = inprocess_times(model, args.dim, args.threads, runs)
        ref_gap = inprocess_p50(model, args.dim, args.threads, runs, gap_s=gap_s)
        pin(client_cpus)
        rt = measure(urls[1], args.dim, warmup, duration, args.trip_pid)
    return {"compute": m["server_compute_p50_ms"], "e2e": m["latency_p50_ms"], "queue": m["server_queue_p50_ms"],
            "p99": m["latency_p99_ms"], "ref": ref, "ref_cpu": ref_cpu,
            "srv_cpu": m["server_cpu_ms"], "trip_cpu": rt["server_cpu_ms"], "ref_gap": ref_gap, "gap_ms": gap_s * 1e3,
            "trip": rt["latency_p50_ms"], "steal": st.pct, "yard": speed}


def lease_cpus(n: int) -> tuple[set[int], set[int]]:
    """(client CPUs, server CPUs) of an ``n``-core lease on this host: the server on the first ``n`` cores, the
    client on the rest (on the same cores where none is left)."""
    server = set(CORES[:n])
    return (set(CORES[n:]) or server), server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs for a CI smoke test")
    ap.add_argument("--dim", type=int, default=256, help="matrix size (input [1, dim, dim] FP32)")
    ap.add_argument("--threads", type=int, default=None, help="server intra-op threads (default: the lease's "
                                                                 "cores)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)")
    ap.add_argument("--leases", default=None, help="lease sizes in cores (default 1,2; quick 1)")
    ap.add_argument("--colocate", action=argparse.BooleanOptionalAction, default=None,
                    help="the co-location table (default: on; quick: off)")
    args = ap.parse_args()
    warmup, duration, runs = (0.3, 1.0, 100) if args.quick else (1.0, 3.0, 400)
    rounds = args.rounds or (2 if args.quick else 5)
    ncores = len(CORES)
    leases = [int(n) for n in (args.leases or ("1" if args.quick else "1,2")).split(",") if int(n) <= ncores]
    for n in leases:
        lease_table(args, n, rounds, (warmup, duration, runs))
    if (args.colocate if args.colocate is not None else not args.quick) and ncores >= 2:
        colocation(args, rounds, warmup, duration)


def lease_table(args: argparse.Namespace, n: int, rounds: int, timing: tuple[float, float, int]) -> None:
    """The fidelity table of an ``n``-core lease."""
    warmup, duration, runs = timing
    client_cpus, server_cpus = lease_cpus(n)
    args = argparse.Namespace(**{**vars(args), "threads": args.threads or n})
    print(f"\n== {n}-core lease")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        pin(server_cpus)  # the in-process references run where the server runs
        model, layers = calibrate(tmp, args.dim, args.threads)
        ident = identity_model(tmp / "identity.onnx", (args.dim, args.dim))
        with farm_server_pid(model, threads=args.threads, cpu_set=server_cpus) as (url, pid), \
                farm_server_pid(ident, threads=args.threads, cpu_set=server_cpus) as (trip_url, trip_pid):
            args.server_pid, args.trip_pid = pid, trip_pid
            rows = [one_round((url, trip_url), model, (client_cpus, server_cpus), args, warmup, duration, runs)
                    for _ in range(rounds)]
    payload_kib = args.dim * args.dim * 4 / 1024
    print(f"model: {layers} MatMuls of [1,{args.dim},{args.dim}] x [{args.dim},{args.dim}] FP32 "
          f"({payload_kib:.0f} KiB in and out), {args.threads} intra-op thread(s); "
          f"client CPUs {sorted(client_cpus or [])}, server CPUs {sorted(server_cpus or [])}; {rounds} rounds")
    print("  round  compute  in-process  +idle gap   vs in-proc  vs +gap   e2e    compute+trip  e2e vs parts  steal"
          "  yardstick")
    for i, r in enumerate(rows):
        print(f"  {i + 1:5d} {r['compute']:8.3f} {r['ref']:10.3f} {r['ref_gap']:10.3f} "
              f"{100 * (r['compute'] / r['ref'] - 1):+10.1f} % {100 * (r['compute'] / r['ref_gap'] - 1):+6.1f} % "
              f"{r['e2e']:7.3f} {r['compute'] + r['trip']:12.3f} "
              f"{100 * (r['e2e'] / (r['compute'] + r['trip']) - 1):+11.1f} %"
              f" {r['steal']:5.1f} % {r['yard']:8.1f}")

    def med(f) -> float:  # type: ignore[no-untyped-def]
        return float(np.median([f(r) for r in rows]))

    print(f"server compute p50 (farm_compute_ns) vs in-process InferenceSession.run p50, median of the rounds' "
          f"ratios: back to back {100 * (med(lambda r: r['compute'] / r['ref']) - 1):+.1f} %, with the server's "
          f"idle gap ({med(lambda r: r['gap_ms']):.2f} ms) before each run "
          f"{100 * (med(lambda r: r['compute'] / r['ref_gap']) - 1):+.1f} % (target within 5 %)")
    print(f"end-to-end p50 vs compute + identity round trip, median of the rounds' ratios: "
          f"{100 * (med(lambda r: r['e2e'] / (r['compute'] + r['trip'])) - 1):+.1f} % (target within 5 %); "
          f"server queue p50 {med(lambda r: r['queue']):.3f} ms, end-to-end p99 {med(lambda r: r['p99']):.3f} ms")
    worst = max(r["steal"] for r in rows)
    print(f"CPU time the hypervisor took (steal): up to {worst:.1f} % in a round"
          + steal_flag(worst))
    ratios = [100 * (r["compute"] / r["ref"] - 1) for r in rows]
    yard = [r["yard"] for r in rows]
    print(f"in-process CPU time per run (p50, every ORT thread) vs its wall time: "
          f"{med(lambda r: r['ref_cpu']):.3f} vs {med(lambda r: r['ref']):.3f} ms; server compute vs in-process CPU "
          f"time {100 * (med(lambda r: r['compute'] / r['ref_cpu']) - 1):+.1f} % (wall well above CPU: the reference "
          "was kept off its cores by other processes)")
    print(f"CPU time, robust to a loaded host: the server's per request (every thread, gRPC handling included) "
          f"{med(lambda r: r['srv_cpu']):.3f} ms vs in-process per run {med(lambda r: r['ref_cpu']):.3f} ms: "
          f"{100 * (med(lambda r: r['srv_cpu'] / r['ref_cpu']) - 1):+.1f} % (median of the rounds' ratios; range "
          f"{min(100 * (r['srv_cpu'] / r['ref_cpu'] - 1) for r in rows):+.1f} to "
          f"{max(100 * (r['srv_cpu'] / r['ref_cpu'] - 1) for r in rows):+.1f} %)")
    print(f"  less the identity server's CPU per request (the same tensors through gRPC, no compute) "
          f"{med(lambda r: r['trip_cpu']):.3f} ms: "
          f"{100 * (med(lambda r: (r['srv_cpu'] - r['trip_cpu']) / r['ref_cpu']) - 1):+.1f} % (target within 5 %)")
    print(f"spread of the rounds' compute vs in-process: {min(ratios):+.1f} to {max(ratios):+.1f} %; host yardstick "
          f"(passes/s on the server cores) {min(yard):.1f}-{max(yard):.1f}, "
          f"{100 * (max(yard) / min(yard) - 1):.0f} % apart")


def colocated_job(url: str, pid: int, core: int, dim: int, warmup: float, duration: float,
                  out: dict[str, float]) -> None:
    """One job on ``core`` (its server there already; its client pinned there by this thread), with the
    foreign load on that core: busy time less the job's server, its own load process and this process (which
    holds both jobs' coordinators: an over-count of the job's own time, so foreign load is under-, not
    over-estimated)."""
    pin({core})
    server = ProcessTreeSampler(pid)
    mine = ProcessesCpu(lambda: [p for p in load_process_pids() if _on(p, core)])
    with ExitStack() as stack:
        stack.enter_context(server)
        own = partial(job_cpu_s, True, mine)  # as a farm job counts: this process too (both jobs' coordinators)
        foreign = stack.enter_context(ForeignLoadSampler([core], server, own=own))
        out.update(measure(url, dim, warmup, duration))
    out["foreign"] = foreign.figures().get("foreign_cpu_pct") or 0.0


def _on(pid: int, core: int) -> bool:
    try:
        return os.sched_getaffinity(pid) == {core}
    except OSError:
        return False


def colocation(args: argparse.Namespace, rounds: int, warmup: float, duration: float) -> None:
    """Two one-core jobs alone and together, in rounds (the order alternating); each one's compute p50
    together / alone, and its foreign load while together."""
    cores = CORES[:2]
    with tempfile.TemporaryDirectory() as tmpdir:
        pin({cores[0]})
        model, layers = calibrate(Path(tmpdir), args.dim, 1)
        rows: list[dict[str, float]] = []
        with farm_server_pid(model, threads=1, cpu_set={cores[0]}) as a, \
                farm_server_pid(model, threads=1, cpu_set={cores[1]}) as b:
            for r in range(rounds):
                row: dict[str, float] = {"yard": yardstick(set(cores)).speed}
                for who, (url, pid), core in (("a", a, cores[0]), ("b", b, cores[1]))[:: 1 if r % 2 == 0 else -1]:
                    alone: dict[str, float] = {}
                    colocated_job(url, pid, core, args.dim, warmup, duration, alone)
                    row[f"{who}_alone"], row[f"{who}_alone_foreign"] = alone["server_compute_p50_ms"], alone["foreign"]
                both: dict[str, dict[str, float]] = {"a": {}, "b": {}}
                threads = [threading.Thread(target=colocated_job, args=(url, pid, core, args.dim, warmup, duration,
                                                                       both[who]))
                           for who, (url, pid), core in (("a", a, cores[0]), ("b", b, cores[1]))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for who in "ab":
                    row[f"{who}_both"], row[f"{who}_foreign"] = both[who]["server_compute_p50_ms"], both[who]["foreign"]
                rows.append(row)
    print(f"\n== co-location: two jobs of {layers} MatMuls, job a on core {cores[0]}, job b on core {cores[1]} "
          f"(server and client each), alone then together; {rounds} rounds")
    print("  round  a alone  a both   a vs alone  a foreign   b alone  b both   b vs alone  b foreign  yardstick")
    for i, r in enumerate(rows):
        cells = []
        for who in "ab":
            change = 100 * (r[f"{who}_both"] / r[f"{who}_alone"] - 1)
            flag = " busy" if r[f"{who}_foreign"] > BUSY_PCT else ""
            cells.append(f"{r[f'{who}_alone']:7.3f} {r[f'{who}_both']:7.3f} {change:+9.1f} % "
                         f"{r[f'{who}_foreign']:6.1f} %{flag:5s}")
        print(f"  {i + 1:5d} {'  '.join(cells)} {r['yard']:8.1f}")
    for who in "ab":
        ch = [100 * (r[f"{who}_both"] / r[f"{who}_alone"] - 1) for r in rows]
        flagged = sum(r[f"{who}_foreign"] > BUSY_PCT for r in rows)
        unflagged_out = sum(abs(c) > 10 and r[f"{who}_foreign"] <= BUSY_PCT for c, r in zip(ch, rows, strict=True))
        print(f"job {who}: compute together vs alone, median {float(np.median(ch)):+.1f} % (range {min(ch):+.1f} to "
              f"{max(ch):+.1f} %); rounds flagged host busy {flagged} of {len(rows)}; rounds beyond 10 % and not "
              f"flagged: {unflagged_out} (target 0)")


if __name__ == "__main__":
    main()

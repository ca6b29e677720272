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
alike.

Run: ``python benchmarks/fidelity.py [--quick] [--rounds N]``. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from _serve import Steal, farm_server, identity_model, matmul_chain_model, pin, split_cpus, steal_flag  # noqa: I001

from schemas import MeasurementSettings, TensorSpec
from workers.loadgen import run_load

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
    sess = session(model, threads)
    x = np.random.default_rng(0).random((1, dim, dim), dtype=np.float32)
    for _ in range(20):
        sess.run(None, {"x": x})
    times = []
    for _ in range(runs):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter_ns()
        sess.run(None, {"x": x})
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return float(np.percentile(times, 50))


def calibrate(tmp: Path, dim: int, threads: int) -> tuple[Path, int]:
    """A MatMul chain whose single request takes about TARGET_MS in-process."""
    one = inprocess_p50(matmul_chain_model(tmp / "one.onnx", 1, dim), dim, threads, 50)
    layers = max(1, round(TARGET_MS / one))
    return matmul_chain_model(tmp / f"chain{layers}.onnx", layers, dim), layers


def measure(url: str, dim: int, warmup: float, duration: float) -> dict[str, float]:
    # farm's own generator: it reads the server's per-request compute time (perf_analyzer gets averages only)
    settings = MeasurementSettings(client="farm", warmup_s=warmup, window_s=1.0, duration_s=duration)
    r = run_load(url, "model", [TensorSpec(name="x", shape=(dim, dim))], 1, 1, settings, processes=1)
    return {k: v for k, v in r.metrics.items() if isinstance(v, float)}


def one_round(urls: tuple[str, str], model: Path, cpus: tuple[set[int] | None, set[int] | None],
              args: argparse.Namespace, warmup: float, duration: float, runs: int) -> dict[str, float]:
    """One round: the model's server under load, the in-process references on the server's CPU (back to
    back, and with the server's idle gap before each run), then the identity server's round trip.
    Doing all of them within one round, round after round, keeps the host's drift out of the ratios."""
    client_cpus, server_cpus = cpus
    pin(client_cpus)
    with Steal() as st:
        m = measure(urls[0], args.dim, warmup, duration)
        pin(server_cpus)
        gap_s = max(0.0, m["latency_p50_ms"] - m["server_compute_p50_ms"]) / 1e3
        ref = inprocess_p50(model, args.dim, args.threads, runs)
        ref_gap = inprocess_p50(model, args.dim, args.threads, runs, gap_s=gap_s)
        pin(client_cpus)
        rt = measure(urls[1], args.dim, warmup, duration)
    return {"compute": m["server_compute_p50_ms"], "e2e": m["latency_p50_ms"], "queue": m["server_queue_p50_ms"],
            "p99": m["latency_p99_ms"], "ref": ref, "ref_gap": ref_gap, "gap_ms": gap_s * 1e3,
            "trip": rt["latency_p50_ms"], "steal": st.pct}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs for a CI smoke test")
    ap.add_argument("--dim", type=int, default=256, help="matrix size (input [1, dim, dim] FP32)")
    ap.add_argument("--threads", type=int, default=1, help="server intra-op threads")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)")
    args = ap.parse_args()
    warmup, duration, runs = (0.3, 1.0, 100) if args.quick else (1.0, 3.0, 400)
    rounds = args.rounds or (2 if args.quick else 5)
    client_cpus, server_cpus = split_cpus()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        pin(server_cpus)  # the in-process references run where the server runs
        model, layers = calibrate(tmp, args.dim, args.threads)
        ident = identity_model(tmp / "identity.onnx", (args.dim, args.dim))
        with farm_server(model, threads=args.threads, cpu_set=server_cpus) as url, \
                farm_server(ident, threads=args.threads, cpu_set=server_cpus) as trip_url:
            rows = [one_round((url, trip_url), model, (client_cpus, server_cpus), args, warmup, duration, runs)
                    for _ in range(rounds)]
    payload_kib = args.dim * args.dim * 4 / 1024
    print(f"model: {layers} MatMuls of [1,{args.dim},{args.dim}] x [{args.dim},{args.dim}] FP32 "
          f"({payload_kib:.0f} KiB in and out), {args.threads} intra-op thread(s); "
          f"client CPUs {sorted(client_cpus or [])}, server CPUs {sorted(server_cpus or [])}; {rounds} rounds")
    print("  round  compute  in-process  +idle gap   vs in-proc  vs +gap   e2e    compute+trip  e2e vs parts  steal")
    for i, r in enumerate(rows):
        print(f"  {i + 1:5d} {r['compute']:8.3f} {r['ref']:10.3f} {r['ref_gap']:10.3f} "
              f"{100 * (r['compute'] / r['ref'] - 1):+10.1f} % {100 * (r['compute'] / r['ref_gap'] - 1):+6.1f} % "
              f"{r['e2e']:7.3f} {r['compute'] + r['trip']:12.3f} "
              f"{100 * (r['e2e'] / (r['compute'] + r['trip']) - 1):+11.1f} %"
              f" {r['steal']:5.1f} %")

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


if __name__ == "__main__":
    main()

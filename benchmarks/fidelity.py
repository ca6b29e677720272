"""Does farm measure what the model costs? Server-side compute vs in-process, end-to-end vs the parts.

A chain of MatMuls sized to take ~5 ms per request single-threaded (calibrated here), served by farm's
built-in server with 1 intra-op thread, driven by farm's generator in closed loop, concurrency 1:

1. server compute p50 (``farm_compute_ns``) vs ``InferenceSession.run`` p50 in-process with the same
   thread count on the same CPU (target: within 5 %);
2. end-to-end p50 vs server compute p50 + the round trip of an identity model with the same tensor
   sizes (target: within 5 %).

Run: ``python benchmarks/fidelity.py [--quick]``. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from _serve import Steal, farm_server, identity_model, matmul_chain_model, pin, split_cpus  # noqa: I001
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


def inprocess_p50(model: Path, dim: int, threads: int, runs: int) -> float:
    """p50 in ms of ``InferenceSession.run`` on a [1, dim, dim] input, after 20 warm-up runs."""
    sess = session(model, threads)
    x = np.random.default_rng(0).random((1, dim, dim), dtype=np.float32)
    for _ in range(20):
        sess.run(None, {"x": x})
    times = []
    for _ in range(runs):
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
    settings = MeasurementSettings(warmup_s=warmup, window_s=1.0, duration_s=duration)
    r = run_load(url, "model", [TensorSpec(name="x", shape=(dim, dim))], 1, 1, settings, processes=1)
    return {k: v for k, v in r.metrics.items() if isinstance(v, float)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs for a CI smoke test")
    ap.add_argument("--dim", type=int, default=256, help="matrix size (input [1, dim, dim] FP32)")
    ap.add_argument("--threads", type=int, default=1, help="server intra-op threads")
    args = ap.parse_args()
    warmup, duration, runs = (0.5, 2.0, 100) if args.quick else (2.0, 10.0, 1000)
    client_cpus, server_cpus = split_cpus()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        pin(server_cpus)  # the in-process reference runs where the server will run
        model, layers = calibrate(tmp, args.dim, args.threads)
        with Steal() as st_before:
            ref_before = inprocess_p50(model, args.dim, args.threads, runs)
        pin(client_cpus)
        ident = identity_model(tmp / "identity.onnx", (args.dim, args.dim))
        with Steal() as st_server, farm_server(model, threads=args.threads, cpu_set=server_cpus) as url:
            m = measure(url, args.dim, warmup, duration)
        pin(server_cpus)  # again after, to show how much the machine drifted meanwhile
        with Steal() as st_after:
            ref_after = inprocess_p50(model, args.dim, args.threads, runs)
        ref = (ref_before + ref_after) / 2
        pin(client_cpus)
        with Steal() as st_trip, farm_server(ident, threads=args.threads, cpu_set=server_cpus) as url:
            rt = measure(url, args.dim, warmup, duration)
    payload_kib = args.dim * args.dim * 4 / 1024
    compute, e2e, trip = m["server_compute_p50_ms"], m["latency_p50_ms"], rt["latency_p50_ms"]
    print(f"model: {layers} MatMuls of [1,{args.dim},{args.dim}] x [{args.dim},{args.dim}] FP32 "
          f"({payload_kib:.0f} KiB in and out), {args.threads} intra-op thread(s); "
          f"client CPUs {sorted(client_cpus or [])}, server CPUs {sorted(server_cpus or [])}")
    print(f"in-process InferenceSession.run p50   {ref:8.3f} ms  (mean of {ref_before:.3f} before and "
          f"{ref_after:.3f} after the server run, {runs} runs each)")
    print(f"server compute p50 (farm_compute_ns)  {compute:8.3f} ms  -> {100 * (compute / ref - 1):+.1f} % "
          "vs in-process (target within 5 %)")
    print(f"server queue p50                      {m['server_queue_p50_ms']:8.3f} ms")
    print(f"identity-model round trip p50         {trip:8.3f} ms  (server compute "
          f"{rt['server_compute_p50_ms']:.3f} ms)")
    print(f"end-to-end p50                        {e2e:8.3f} ms  -> {100 * (e2e / (compute + trip) - 1):+.1f} % "
          f"vs compute + round trip = {compute + trip:.3f} ms (target within 5 %)")
    print(f"end-to-end p99 / max                  {m['latency_p99_ms']:8.3f} / {m['latency_max_ms']:.3f} ms; "
          f"client busy {m['client_busy_pct']:.0f} %")
    print(f"CPU time the hypervisor took (steal): reference before {st_before.pct:.1f} %, server run "
          f"{st_server.pct:.1f} %, reference after {st_after.pct:.1f} %, round-trip run {st_trip.pct:.1f} %"
          + ("  <- above 5 %: these figures measure the host as much as farm" if max(
              st_before.pct, st_server.pct, st_after.pct, st_trip.pct) > 5 else ""))


if __name__ == "__main__":
    main()

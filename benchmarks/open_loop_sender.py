"""farm's own generator in open loop: its unary sends from a thread of their own (``worker._ThreadSender``, the
default) against sends from its asyncio loop (``FARM_LOADGEN_OPEN_SENDER=aio``, the path before), A/B in
interleaved rounds on one server.

farm's built-in server (onnxruntime, one thread) serves an identity model (FP32 [1, 64]) on the second half of
the CPUs; farm's generator runs in this process (one thread, ``in_process``) on the first half, so both senders
are switched in one process. Each round: the host yardstick on the server's cores, then both senders in turn (the
order alternating), Poisson arrivals at ``--rate``. Printed: per round and sender the late sends (% of sends more
than 1 ms after schedule), p50 and req/s; then each sender's median and range.

Run: ``python benchmarks/open_loop_sender.py [--quick] [--rate R] [--rounds N]``. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _serve import farm_server_pid, identity_model, pin, split_cpus  # noqa: I001 (sets sys.path)

from schemas import MeasurementSettings, TensorSpec
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.loadgen.kserve import worker
from workers.samplers.calibrate import calibrate

SENDERS = ("thread", "aio")


def one_run(url: str, sender: str, rate: float, window: float) -> tuple[float, float, float]:
    """(late %, p50 ms, req/s) of one open-loop run with ``sender``."""
    worker.OPEN_SENDER = sender
    settings = MeasurementSettings(warmup_s=0.5, window_s=window, duration_s=3 * window, mode="poisson", rate=rate,
                                   client="farm")
    r = run_load(LoadTarget(url, "model"),
                 LoadSpec.from_settings([TensorSpec(name="x", shape=(64,))], 1, 1, settings), in_process=True)
    m = {**r.metrics, **(r.details["client_limited_latency"] or {})}
    return float(m["late_send_pct"] or 0.0), float(m["latency_p50_ms"]), float(m["requests_per_s"])  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds of short runs (CI)")
    ap.add_argument("--rate", type=float, default=100.0, help="Poisson arrivals, requests/s (default 100)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 6; quick 2)")
    args = ap.parse_args()
    rounds, window = (args.rounds or 2, 0.5) if args.quick else (args.rounds or 6, 1.0)
    client, server = split_cpus()
    pin(client)
    runs: dict[str, list[tuple[float, float, float]]] = {s: [] for s in SENDERS}
    with tempfile.TemporaryDirectory() as tmp:
        path = identity_model(Path(tmp) / "identity.onnx", (64,))
        with farm_server_pid(path, threads=1, cpu_set=server) as (url, _):
            for r in range(rounds):
                speed = calibrate(server or {0}).speed
                for sender in SENDERS if r % 2 == 0 else SENDERS[::-1]:
                    late, p50, rps = one_run(url, sender, args.rate, window)
                    runs[sender].append((late, p50, rps))
                    print(f"round {r + 1} yardstick {speed:5.1f} passes/s  {sender:6s} late {late:5.1f} %  "
                          f"p50 {p50:7.2f} ms  {rps:5.0f} req/s", flush=True)
    print(f"Poisson {args.rate:g} req/s, {rounds} rounds; client CPUs {sorted(client or [])}, server CPUs "
          f"{sorted(server or [])}")
    for sender in SENDERS:
        late = [x[0] for x in runs[sender]]
        print(f"{sender:6s} late sends median {statistics.median(late):.1f} % (range {min(late):.1f}-{max(late):.1f})"
              f", p50 median {statistics.median(x[1] for x in runs[sender]):.2f} ms")
    fewer = sum(a[0] < b[0] for a, b in zip(runs["thread"], runs["aio"], strict=True))
    print(f"rounds in which the thread sender had fewer late sends: {fewer} of {rounds}")


if __name__ == "__main__":
    main()

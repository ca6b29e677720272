"""farm's load generator against NVIDIA perf_analyzer (C++), the reference client, on the same server.

farm's built-in server (onnxruntime, one thread) serves a model; perf_analyzer (``-i grpc``, unary, sync
calls) and farm's generator (``run_load``, unary ModelInfer, with a job's samplers running in its process:
the server's process tree and the host's CPU) take turns on it in interleaved rounds (A, B, then B, A).
The client is pinned to half of the CPUs, the server to the other half (``split_cpus``).

Cells: closed loop at concurrency 1, 4, 16 with batch 1 and 8; open loop (batch 1), constant and Poisson
arrivals at 30 % and 70 % of the server's capacity (the better client's closed-loop req/s at
concurrency 16, batch 1). Printed per cell: each client's req/s, p50, p99, late sends (open loop) and CPU
per request (perf_analyzer: its process's CPU time via psutil over all its windows; farm: the busy share
of its process, samplers included, per request), then the ratios farm / perf_analyzer and whether they
meet the targets (req/s >= 0.95x, p50 <= 1.05x; open loop: p50 within 5 %, p99 within 10 %, late < 1 %).

Models: ``identity`` (FP32 [b, 64], transport-bound); full runs add ``matmul`` (8 chained 128 x 128
MatMuls on [b, 128, 128], compute-bound). Each figure is the median over the rounds (3; quick: 1).
A third client, farm's ``--client perf_analyzer`` backend (perf_analyzer sends, farm reads its per-request
export into its windows and percentiles), is compared with perf_analyzer run directly in a second table.
The host is a shared 2-core VM: the figures are indicative; the steal is printed with them.

Run: ``python benchmarks/vs_perf_analyzer.py [--quick]``. Skips (exit 0) where perf_analyzer is absent:
install it with ``python3 -m workers.loadgen.perf_analyzer --install``.
"""
from __future__ import annotations

import argparse
import os
import re
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import _perf_analyzer as pa
import numpy as np
from _serve import (  # noqa: I001 (sets sys.path)
    Steal,
    farm_server_pid,
    identity_model,
    matmul_chain_model,
    pin,
    split_cpus,
    steal_flag,
)

from schemas import MeasurementSettings, TensorSpec
from workers.loadgen import run_load

RPS_MIN, P50_MAX = 0.95, 1.05  # closed-loop targets, farm / perf_analyzer
OPEN_P50_TOL, OPEN_P99_TOL, LATE_MAX_PCT = 0.05, 0.10, 1.0  # open-loop targets


@dataclass(frozen=True)
class Fig:
    """One client's figures in one run: req/s, p50 and p99 (ms), late sends (%), CPU us per request."""

    rps: float
    p50: float
    p99: float
    late_pct: float
    cpu_us: float


@dataclass(frozen=True)
class Model:
    """A test model: how to build it, its input's shape without batch."""

    build: Callable[[Path], Path]
    shape: tuple[int, ...]


MODELS: dict[str, Model] = {
    "identity": Model(lambda p: identity_model(p, (64,)), (64,)),
    "matmul": Model(lambda p: matmul_chain_model(p, 8, 128), (128, 128)),
}

Cell = tuple[str, int, int | float]  # (mode, batch, concurrency or share of capacity)


def run_farm(url: str, server_pid: int, model: Model, cell: Cell, rate: float | None, window: float,
             client: str = "farm") -> Fig:
    """farm's measurement of ``cell`` (``client``: its own generator or its perf_analyzer backend) with a
    job's samplers running meanwhile in this process."""
    from workers.samplers.host import HostSampler
    from workers.samplers.process import ProcessTreeSampler

    mode, batch, conc = cell
    settings = MeasurementSettings(warmup_s=window, window_s=window, duration_s=3 * window, mode=mode,
                                   rate=rate if mode != "closed" else None, client=client)
    with ExitStack() as stack:
        stack.enter_context(ProcessTreeSampler(server_pid))
        stack.enter_context(HostSampler())
        r = run_load(url, "model", [TensorSpec(name="x", shape=model.shape)], batch,
                     int(conc) if mode == "closed" else 1, settings, processes=1)
    # a client-limited run reports no latency; its latency stays in the details (compared here all the same,
    # with its late sends shown beside it)
    m = {**r.metrics, **(r.details["client_limited_latency"] or {})}
    rps = float(m["requests_per_s"])  # type: ignore[arg-type]
    return Fig(rps, float(m["latency_p50_ms"]), float(m["latency_p99_ms"]),  # type: ignore[arg-type]
               float(m["late_send_pct"] or 0.0), float(m["client_busy_pct"]) / 100 / rps * 1e6)  # type: ignore[arg-type]


def run_pa(url: str, model: Model, cell: Cell, rate: float | None, window: float,
           cpus: set[int] | None) -> Fig:
    """perf_analyzer on ``cell``."""
    mode, batch, conc = cell
    shape = "x:" + ",".join(map(str, (batch, *model.shape)))
    f = pa.run(url, "model", shape, concurrency=int(conc) if mode == "closed" else None, rate=rate,
               distribution=mode if mode != "closed" else "constant", window_ms=int(window * 1000),
               cpu_set=cpus)
    late = re.search(r"([\d.]+)% of the requests were delayed", f.warning or "")
    return Fig(f.requests_per_s, f.p50_ms, f.p99_ms, float(late.group(1)) if late else 0.0, f.cpu_us_per_request)


def median(figs: list[Fig]) -> Fig:
    """Field-wise median over rounds."""
    return Fig(*(float(np.median([getattr(f, k) for f in figs])) for k in Fig.__dataclass_fields__))


def verdict(cell: Cell, farm: Fig, ref: Fig) -> str:
    """Whether farm met the issue's targets against perf_analyzer in this cell."""
    if cell[0] == "closed":
        ok = farm.rps >= RPS_MIN * ref.rps and farm.p50 <= P50_MAX * ref.p50
    else:
        ok = (abs(farm.p50 / ref.p50 - 1) <= OPEN_P50_TOL and abs(farm.p99 / ref.p99 - 1) <= OPEN_P99_TOL
              and farm.late_pct < LATE_MAX_PCT)
    return "ok" if ok else "MISS"


def label(cell: Cell, rate: float | None) -> str:
    mode, batch, conc = cell
    return f"c={conc} b={batch}" if mode == "closed" else f"{mode} {conc:.0%} ({rate:.0f}/s)"


def bench_model(name: str, cells: list[Cell], rounds: int, window: float, cpus: tuple[set[int] | None, ...]) -> None:
    """Every cell of ``cells`` on model ``name``, interleaved rounds; prints one table."""
    client_cpus, server_cpus = cpus
    model = MODELS[name]
    runs: dict[Cell, dict[str, list[Fig]]] = {c: {"farm": [], "pa": [], "farm-pa": []} for c in cells}
    rates: dict[Cell, float] = {}
    with tempfile.TemporaryDirectory() as tmp, Steal() as steal:
        path = model.build(Path(tmp) / f"{name}.onnx")
        with farm_server_pid(path, threads=1, cpu_set=server_cpus) as (url, pid):
            for r in range(rounds):
                for cell in cells:
                    rate = None
                    if cell[0] != "closed":
                        cap = capacity(runs)
                        rate = rates.setdefault(cell, float(cell[2]) * cap)
                    order = ("farm", "pa", "farm-pa") if r % 2 == 0 else ("farm-pa", "pa", "farm")
                    for who in order:
                        fig = (run_pa(url, model, cell, rate, window, client_cpus) if who == "pa"
                               else run_farm(url, pid, model, cell, rate, window,
                                             "perf_analyzer" if who == "farm-pa" else "farm"))
                        runs[cell][who].append(fig)
    print(f"\n{name}: median of {rounds} round(s), {window:g} s windows; the hypervisor took {steal.pct:.1f} % "
          f"of the CPU time meanwhile{steal_flag(steal.pct)}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs (other tenants' processes share these cores)")
    print(f"  {'cell':22s} {'req/s farm':>10s} {'pa':>7s} {'ratio':>6s}  {'p50 farm':>8s} {'pa':>6s} {'ratio':>6s}  "
          f"{'p99 farm':>8s} {'pa':>6s} {'ratio':>6s}  {'late% farm':>10s} {'pa':>5s}  "
          f"{'CPU us/req farm':>15s} {'pa':>6s}  target")
    for cell in cells:
        f, p = median(runs[cell]["farm"]), median(runs[cell]["pa"])
        print(f"  {label(cell, rates.get(cell)):22s} {f.rps:10.0f} {p.rps:7.0f} {f.rps / p.rps:6.2f}  "
              f"{f.p50:8.3f} {p.p50:6.3f} {f.p50 / p.p50:6.2f}  {f.p99:8.3f} {p.p99:6.3f} {f.p99 / p.p99:6.2f}  "
              f"{f.late_pct:10.1f} {p.late_pct:5.1f}  {f.cpu_us:15.0f} {p.cpu_us:6.0f}  {verdict(cell, f, p)}")
    print("  farm --client perf_analyzer (farm's reading of perf_analyzer's requests) / perf_analyzer run directly:")
    for cell in cells:
        b, p = median(runs[cell]["farm-pa"]), median(runs[cell]["pa"])
        print(f"  {label(cell, rates.get(cell)):22s} req/s {b.rps / p.rps:5.2f}x  p50 {b.p50 / p.p50:5.2f}x  "
              f"p99 {b.p99 / p.p99:5.2f}x  late {b.late_pct:5.1f} %  {verdict(cell, b, p)}")


def capacity(runs: dict[Cell, dict[str, list[Fig]]]) -> float:
    """The server's capacity (req/s): the better client's last closed-loop req/s at the highest
    concurrency measured with batch 1."""
    closed = [c for c in runs if c[0] == "closed" and c[1] == 1 and runs[c]["farm"] and runs[c]["pa"]]
    top = max(closed, key=lambda c: c[2])
    return max(runs[top]["farm"][-1].rps, runs[top]["pa"][-1].rps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs for a CI smoke test")
    ap.add_argument("--models", default=None, help="comma-separated subset of " + ",".join(MODELS))
    args = ap.parse_args()
    why = pa.missing()
    if why:
        print(f"SKIP vs_perf_analyzer: {why}")
        return
    client_cpus, server_cpus = split_cpus()
    pin(client_cpus)
    if args.quick:
        rounds, window, models = 1, 0.5, ["identity"]
        cells: list[Cell] = [("closed", 1, 1), ("closed", 1, 16), ("poisson", 1, 0.3)]
    else:
        rounds, window, models = 3, 1.0, list(MODELS)
        cells = [("closed", b, c) for b in (1, 8) for c in (1, 4, 16)]
        cells += [(m, 1, share) for m in ("constant", "poisson") for share in (0.3, 0.7)]
    if args.models:
        models = args.models.split(",")
    print(f"client CPUs {sorted(client_cpus or [])}, server CPUs {sorted(server_cpus or [])}; unary gRPC; "
          f"perf_analyzer {pa.VERSION} at {pa.binary()}")
    for name in models:
        bench_model(name, cells, rounds, window, (client_cpus, server_cpus))


if __name__ == "__main__":
    main()

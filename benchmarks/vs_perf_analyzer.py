"""farm's load generator against NVIDIA perf_analyzer (C++), the reference client, on the same server.

farm's built-in server (onnxruntime, one thread) serves a model; perf_analyzer (``-i grpc``, unary; sync
calls in closed loop, async calls in open loop, as farm's backend runs it) and farm's generator
(``run_load``, unary ModelInfer, with a job's samplers running in its process: the server's process tree
and the host's CPU) take turns on it in interleaved rounds (A, B, then B, A).
The client is pinned to half of the CPUs, the server to the other half (``split_cpus``).

Cells: closed loop at concurrency 1, 4, 16 with batch 1 and 8; open loop (batch 1), constant and Poisson
arrivals at 30 % and 70 % of the server's capacity (the median of 3 perf_analyzer runs at concurrency 16,
batch 1, before the rounds). Printed per cell: each client's req/s, p50, p99, late sends (open loop) and CPU
per request (perf_analyzer: its process's CPU time via psutil over all its windows; farm: the busy share
of its process, samplers included, per request), then the ratios farm / perf_analyzer and whether they
meet the targets (req/s >= 0.95x, p50 <= 1.05x; open loop: p50 within 5 %, p99 within 10 %, late < 1 %).

Models: ``identity`` (FP32 [b, 64], transport-bound); full runs add ``matmul`` (8 chained 128 x 128
MatMuls on [b, 128, 128], compute-bound). Up to five clients take turns on each cell in every round, the order
rotating from round to round: farm's own generator (``--client farm``), perf_analyzer, farm's default client
(``auto``, which picks its perf_analyzer backend here: perf_analyzer sends, farm reads its per-request export
into its windows and percentiles), perf_analyzer again, the A/A yardstick: how far two runs of the very same
client differ on this host, at concurrency 1 a bare gRPC Python loop (one thread, the request serialized
once, nothing else): the floor under any Python client, and in open loop perf_analyzer with its default sync
API, whose sends wait for a free thread in a burst (late sends, and a tail without the queueing). Each ratio
is the median over the rounds (5; quick: 1) of that round's ratio to perf_analyzer, with its range.
The host is a shared 2-core VM: the steal and load average are printed with the figures.

Run: ``python benchmarks/vs_perf_analyzer.py [--quick]``. Skips (exit 0) where perf_analyzer is absent:
install it with ``python3 -m workers.loadgen.perf_analyzer --install``.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import _perf_analyzer as pa
import grpc
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
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.loadgen.kserve.request import serialized_request
from workers.samplers.calibrate import calibrate
from workers.samplers.host import HostSampler
from workers.samplers.process import ProcessTreeSampler

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
    mode, batch, conc = cell
    settings = MeasurementSettings(warmup_s=window, window_s=window, duration_s=3 * window, mode=mode,
                                   rate=rate if mode != "closed" else None, client=client)
    with ExitStack() as stack:
        stack.enter_context(ProcessTreeSampler(server_pid))
        stack.enter_context(HostSampler())
        r = run_load(LoadTarget(url, "model"),
                     LoadSpec.from_settings([TensorSpec(name="x", shape=model.shape)], batch,
                                            int(conc) if mode == "closed" else 1, settings), processes=1)
    # a client-limited run reports no latency; its latency stays in the details (compared here all the same,
    # with its late sends shown beside it)
    m = {**r.metrics, **(r.details["client_limited_latency"] or {})}
    if client == "auto" and r.details["client"] != "perf_analyzer":
        raise RuntimeError(f"farm's default client did not pick perf_analyzer: {r.details['notes']}")
    rps = float(m["requests_per_s"])  # type: ignore[arg-type]
    return Fig(rps, float(m["latency_p50_ms"]), float(m["latency_p99_ms"]),  # type: ignore[arg-type]
               float(m["late_send_pct"] or 0.0), float(m["client_busy_pct"]) / 100 / rps * 1e6)  # type: ignore[arg-type]


def run_pa(url: str, model: Model, cell: Cell, rate: float | None, window: float,
           cpus: set[int] | None, sync_open_loop: bool = False) -> Fig | None:
    """perf_analyzer on ``cell``: closed loop with its sync API (its default), open loop with its async API
    as farm's backend runs it, or its sync API with ``sync_open_loop`` (open-loop cells only; None else)."""
    mode, batch, conc = cell
    if sync_open_loop and mode == "closed":
        return None
    f = pa.run(url, "model", [TensorSpec(name="x", shape=model.shape)], batch,
               concurrency=int(conc) if mode == "closed" else None, rate=rate,
               distribution=mode if mode != "closed" else "constant", window_ms=int(window * 1000), cpu_set=cpus,
               use_async=mode != "closed" and not sync_open_loop)
    return Fig(f.requests_per_s, f.p50_ms, f.p99_ms, pa.late_pct(f.warning or "") or 0.0, f.cpu_us_per_request)


def run_bare(url: str, model: Model, cell: Cell, window: float) -> Fig | None:
    """The floor of gRPC Python: one thread calling the unary ModelInfer RPC in a loop, the request
    serialized once, the answer left as bytes, nothing recorded but two clock reads per call (no asyncio,
    no windows, no samplers). What any Python client pays per call on this host; measured at concurrency 1
    only (None for other cells), after one window of warm-up, for three windows."""
    mode, batch, conc = cell
    if mode != "closed" or conc != 1:
        return None
    req = serialized_request("model", [TensorSpec(name="x", shape=model.shape)], batch)
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        end = time.perf_counter() + window
        while time.perf_counter() < end:
            call(req)
        lat: list[float] = []
        cpu0, t0 = time.process_time(), time.perf_counter()
        end = t0 + 3 * window
        while (t := time.perf_counter()) < end:
            call(req)
            lat.append(time.perf_counter() - t)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    p50, p99 = np.percentile(np.asarray(lat) * 1e3, (50, 99))
    return Fig(len(lat) / wall, float(p50), float(p99), 0.0, cpu / len(lat) * 1e6)


def median(figs: list[Fig]) -> Fig:
    """Field-wise median over rounds."""
    return Fig(*(float(np.median([getattr(f, k) for f in figs])) for k in Fig.__dataclass_fields__))


def paired(a: list[Fig], b: list[Fig]) -> Fig:
    """Field-wise median of the per-round ratios a / b (each round's two runs taken minutes apart at most,
    so a slow stretch of the host hits both); late sends stay a's median, not a ratio."""
    ratios = {k: float(np.median([getattr(x, k) / getattr(y, k) for x, y in zip(a, b, strict=True)]))
              for k in ("rps", "p50", "p99", "cpu_us")}
    return Fig(late_pct=median(a).late_pct, **ratios)


def spread(a: list[Fig], b: list[Fig], key: str) -> str:
    """The range of the per-round ratios a / b on ``key``, e.g. ``0.97-1.04``."""
    r = [getattr(x, key) / getattr(y, key) for x, y in zip(a, b, strict=True)]
    return f"{min(r):.2f}-{max(r):.2f}"


def verdict(cell: Cell, ratio: Fig) -> str:
    """Whether a client met the issue's targets against perf_analyzer in this cell (``ratio``: the
    median per-round ratios, :func:`paired`)."""
    if cell[0] == "closed":
        ok = ratio.rps >= RPS_MIN and ratio.p50 <= P50_MAX
    else:
        ok = (abs(ratio.p50 - 1) <= OPEN_P50_TOL and abs(ratio.p99 - 1) <= OPEN_P99_TOL
              and ratio.late_pct < LATE_MAX_PCT)
    return "ok" if ok else "MISS"


def label(cell: Cell, rate: float | None) -> str:
    mode, batch, conc = cell
    return f"c={conc} b={batch}" if mode == "closed" else f"{mode} {conc:.0%} ({rate:.0f}/s)"


# farm's own generator, perf_analyzer, farm's default client (auto: its perf_analyzer backend), A/A, the
# floor of gRPC Python (concurrency 1 only) and perf_analyzer's sync API in open loop (open-loop cells only)
CLIENTS = ("farm", "pa", "farm-pa", "pa2", "bare", "pa-sync")


def measure_cell(url: str, pid: int, model: Model, cell: Cell, rate: float | None, window: float,
                 client_cpus: set[int] | None, who: str) -> Fig | None:
    """One client's run of ``cell``: ``pa``/``pa2`` perf_analyzer run directly, ``farm`` farm's own
    generator (``--client farm``), ``farm-pa`` farm's default client (``auto``, which picks its
    perf_analyzer backend here), ``bare`` a bare gRPC Python loop (None where it does not run)."""
    if who in ("pa", "pa2", "pa-sync"):
        return run_pa(url, model, cell, rate, window, client_cpus, sync_open_loop=who == "pa-sync")
    if who == "bare":
        return run_bare(url, model, cell, window)
    return run_farm(url, pid, model, cell, rate, window, "auto" if who == "farm-pa" else "farm")


def bench_model(name: str, cells: list[Cell], rounds: int, window: float, cpus: tuple[set[int] | None, ...],
                clients: tuple[str, ...] = CLIENTS) -> None:
    """Every cell of ``cells`` on model ``name``: in each round every client measures the cell in turn, the
    order rotating from round to round; prints one table."""
    client_cpus, server_cpus = cpus
    model = MODELS[name]
    runs: dict[Cell, dict[str, list[Fig]]] = {c: {who: [] for who in CLIENTS} for c in cells}
    yard: list[float] = []  # the host yardstick (passes/s on the server's cores) before each round
    with tempfile.TemporaryDirectory() as tmp, Steal() as steal:
        path = model.build(Path(tmp) / f"{name}.onnx")
        with farm_server_pid(path, threads=1, cpu_set=server_cpus) as (url, pid):
            cap = capacity(url, model, window, client_cpus) if any(c[0] != "closed" for c in cells) else 0.0
            rates = {c: float(c[2]) * cap for c in cells if c[0] != "closed"}
            for r in range(rounds):
                yard.append(calibrate(server_cpus or {0}).speed)
                for cell in cells:
                    rate = rates.get(cell)
                    for who in clients[r % len(clients):] + clients[:r % len(clients)]:
                        fig = measure_cell(url, pid, model, cell, rate, window, client_cpus, who)
                        if fig is not None:
                            runs[cell][who].append(fig)
    print(f"\n{name}: {rounds} round(s), {window:g} s windows; the hypervisor took {steal.pct:.1f} % of the CPU "
          f"time meanwhile{steal_flag(steal.pct)}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
          + (f"; capacity {cap:.0f} req/s (perf_analyzer at c=16, median of {CAPACITY_RUNS})" if cap else ""))
    print(f"  host yardstick (workers/samplers/calibrate.py, server cores, before each round): median "
          f"{np.median(yard):.1f} passes/s, range {min(yard):.1f}-{max(yard):.1f} "
          f"({100 * (max(yard) / min(yard) - 1):.0f} % apart)")
    print("  medians: req/s, p50 and p99 (ms), late sends (%), client CPU (us per request); ratios: the median of "
          "the per-round ratios (range)")
    print(f"  {'cell':22s} {'req/s farm':>10s} {'pa':>7s}  {'p50 farm':>8s} {'pa':>6s}  {'p99 farm':>8s} {'pa':>7s}  "
          f"{'late% farm':>10s} {'pa':>5s}  {'CPU/req farm':>12s} {'pa':>6s}")
    for cell in cells:
        f, p = median(runs[cell]["farm"]), median(runs[cell]["pa"])
        print(f"  {label(cell, rates.get(cell)):22s} {f.rps:10.0f} {p.rps:7.0f}  {f.p50:8.3f} {p.p50:6.3f}  "
              f"{f.p99:8.3f} {p.p99:7.3f}  {f.late_pct:10.1f} {p.late_pct:5.1f}  {f.cpu_us:12.0f} {p.cpu_us:6.0f}")
    for who, title in (("farm", "farm's own generator (--client farm) / perf_analyzer"),
                       ("farm-pa", "farm's default client (auto: perf_analyzer sends, farm reads its requests) / "
                                   "perf_analyzer"),
                       ("pa2", "A/A yardstick: perf_analyzer / perf_analyzer (the host's own noise)"),
                       ("bare", "the floor of gRPC Python: a bare unary loop / perf_analyzer (c=1)"),
                       ("pa-sync", "perf_analyzer's sync API in open loop / its async API (what farm runs): "
                                   "late sends hide the queueing")):
        measured = [c for c in cells if runs[c][who]]
        if not measured:  # the bare loop outside concurrency 1, the sync API outside open loop
            continue
        print(f"  {title}:")
        met = 0
        for cell in measured:
            a, b = runs[cell][who], runs[cell]["pa"]
            q = paired(a, b)
            v = verdict(cell, q)
            met += v == "ok"
            print(f"    {label(cell, rates.get(cell)):22s} req/s {q.rps:5.2f}x ({spread(a, b, 'rps')})  "
                  f"p50 {q.p50:5.2f}x ({spread(a, b, 'p50')})  p99 {q.p99:5.2f}x ({spread(a, b, 'p99')})  "
                  f"late {q.late_pct:5.1f} %  CPU/req {q.cpu_us:5.2f}x  {v}")
        print(f"    targets met in {met} of {len(measured)} cells")


CAPACITY_RUNS = 3  # perf_analyzer runs at CAPACITY_CELL whose median is the server's capacity


CAPACITY_CELL: Cell = ("closed", 1, 16)


def capacity(url: str, model: Model, window: float, client_cpus: set[int] | None) -> float:
    """The server's capacity (req/s, batch 1): the median of ``CAPACITY_RUNS`` perf_analyzer runs at
    concurrency 16, measured before the rounds (one noisy figure would set the open-loop rates too high
    or too low)."""
    return float(np.median([run_pa(url, model, CAPACITY_CELL, None, window, client_cpus).rps
                            for _ in range(CAPACITY_RUNS)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs for a CI smoke test")
    ap.add_argument("--models", default=None, help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=None, help="rounds per cell (default 5; quick: 1)")
    ap.add_argument("--loop", choices=("all", "closed", "open"), default="all", help="which cells to run")
    ap.add_argument("--concurrency", default=None, help="closed-loop cells only at these (e.g. 1)")
    ap.add_argument("--batches", default=None, help="closed-loop cells only at these batch sizes (e.g. 1)")
    ap.add_argument("--shares", default=None, help="open-loop cells only at these shares of capacity (e.g. 0.3)")
    ap.add_argument("--arrivals", default=None, help="open-loop cells only with these (constant,poisson)")
    ap.add_argument("--clients", default=None, help="only these clients besides pa (of " + ",".join(CLIENTS) + ")")
    args = ap.parse_args()
    why = pa.ensure()  # as farm's default client does: installed on first use where it can be
    if why:
        print(f"SKIP vs_perf_analyzer: {why}")
        return
    client_cpus, server_cpus = split_cpus()
    pin(client_cpus)
    if args.quick:
        rounds, window, models = 1, 0.5, ["identity"]
        cells: list[Cell] = [("closed", 1, 1), ("closed", 1, 16), ("poisson", 1, 0.3)]
    else:
        rounds, window, models = 5, 1.0, list(MODELS)
        cells = [("closed", b, c) for b in (1, 8) for c in (1, 4, 16)]
        cells += [(m, 1, share) for m in ("constant", "poisson") for share in (0.3, 0.7)]
    if args.models:
        models = args.models.split(",")
    if args.rounds:
        rounds = args.rounds
    if args.concurrency:
        keep = {int(c) for c in args.concurrency.split(",")}
        cells = [c for c in cells if c[0] != "closed" or c[2] in keep]
    if args.batches:
        keep = {int(b) for b in args.batches.split(",")}
        cells = [c for c in cells if c[0] != "closed" or c[1] in keep]
    if args.shares:
        keep_f = {float(x) for x in args.shares.split(",")}
        cells = [c for c in cells if c[0] == "closed" or c[2] in keep_f]
    if args.arrivals:
        keep_s = set(args.arrivals.split(","))
        cells = [c for c in cells if c[0] == "closed" or c[0] in keep_s]
    clients = ("pa", *(c for c in args.clients.split(",") if c != "pa")) if args.clients else CLIENTS
    if args.loop != "all":
        cells = [c for c in cells if (c[0] == "closed") == (args.loop == "closed")]
    print(f"client CPUs {sorted(client_cpus or [])}, server CPUs {sorted(server_cpus or [])}; unary gRPC; "
          f"perf_analyzer {pa.VERSION} at {pa.binary()}")
    for name in models:
        bench_model(name, cells, rounds, window, (client_cpus, server_cpus), clients)


if __name__ == "__main__":
    main()

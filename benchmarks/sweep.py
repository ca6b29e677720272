"""Quick search vs brute force over the same space, wall time per measured configuration, and the effect of
dynamic batching.

1. For a compute-bound model (farm's ``compute`` example, a MatMul chain) and a transport-bound one (an
   Identity over [1, 16]), every (instances x concurrency) cell is measured (brute force), and, interleaved
   with it cell by cell on the same server, farm's quick search (``scheduler.search_rules.decide``, the very
   function the scheduler runs) bisects concurrency under a p99 budget per serving configuration. Printed:
   the configuration each picks, the share of the cells quick measured (target <= 1/3), quick's pick as
   brute force measured that same cell over brute's best (target >= 0.95), and the two picks measured
   again side by side in interleaved rounds (brute's best is the top of many noisy figures, so its own
   figure flatters it; the re-measurement does not).
2. The median wall time of one measured configuration (load generator start, warm-up and windows until 3
   agree within ±10 %, perf_analyzer's stability rule), target <= 5 s (perf_analyzer's defaults: >= 15 s).
3. Dynamic batching: batch-1 requests at concurrency 8 on the compute-bound model, with a queue delay vs
   without, in interleaved rounds (fresh server each); the ratio's median and spread, and the batch sizes
   the server reports it executed.

Client and server are pinned to separate CPUs where there are two. The machine is shared and noisy: the
figures are indicative, and each section prints the CPU share the hypervisor took (steal) meanwhile.

Run: ``python benchmarks/sweep.py [--quick]``. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from _serve import Steal, farm_server, identity_model, pin, split_cpus, steal_flag  # noqa: I001

from scheduler.search_rules import Step, decide
from schemas import MeasurementSettings, TensorSpec
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget

BUDGET_X = 4.0  # the p99 budget, in p99s of one request at a time on one instance


def measure(url: str, name: str, shape: tuple[int, ...], conc: int, settings: MeasurementSettings,
            walls: list[float]) -> Step:
    """One configuration: throughput (infer/s) and p99 (ms); its wall time (load process start, warm-up,
    windows) is appended to ``walls``."""
    t0 = time.perf_counter()
    r = run_load(LoadTarget(url, "model"),
                 LoadSpec.from_settings([TensorSpec(name=name, shape=shape)], 1, conc, settings), processes=1)
    walls.append(time.perf_counter() - t0)
    return Step(conc, float(r.metrics["throughput_infer_per_s"]),  # type: ignore[arg-type]
                float(r.metrics["latency_p99_ms"]))  # type: ignore[arg-type]


def compare_search(label: str, model: Path, name: str, shape: tuple[int, ...], instances: list[int],
                   levels: list[int], settings: MeasurementSettings, server_cpus: set[int] | None,
                   walls: list[float], rounds: int) -> None:
    """Brute force and quick search over instances x levels, interleaved cell by cell; prints the picks.
    The p99 budget is ``BUDGET_X`` times the p99 of one request at a time, measured first (in neither)."""
    brute: dict[tuple[int, int], Step] = {}
    picks: list[tuple[int, Step]] = []
    quick_cells = 0
    with farm_server(model, threads=1, cpu_set=server_cpus) as url:
        budget_ms = BUDGET_X * (measure(url, name, shape, 1, settings, []).p99_ms or 0.0)
    with Steal() as st:
        for inst in instances:
            with farm_server(model, threads=1, instances=inst, cpu_set=server_cpus) as url:
                todo, steps = list(levels), []
                while True:
                    d = decide(levels, steps, budget_ms)
                    if not todo and d.done:
                        break
                    if todo:
                        c = todo.pop(0)
                        brute[(inst, c)] = measure(url, name, shape, c, settings, walls)
                    if not d.done:
                        assert d.next is not None
                        steps.append(measure(url, name, shape, d.next, settings, walls))
                quick_cells += len(steps)
                if d.best is not None:
                    picks.append((inst, d.best))
    within = {k: s for k, s in brute.items() if s.p99_ms is not None and s.p99_ms <= budget_ms}
    print(f"\n{label}: p99 budget {budget_ms:.2f} ms ({BUDGET_X:g} x p99 at c=1), instances {instances} x "
          f"concurrency {levels} ({len(brute)} cells); host steal {st.pct:.1f} %{steal_flag(st.pct)}")
    if not within or not picks:
        print("  no cell met the budget (brute force) or quick search found none; raise the budget")
        return
    (bi, bc), best = max(within.items(), key=lambda kv: kv[1].throughput or 0.0)
    qi, qstep = max(picks, key=lambda p: p[1].throughput or 0.0)
    print(f"  brute force picks i={bi} c={bc}: {best.throughput:.1f} infer/s, p99 {best.p99_ms:.2f} ms")
    print(f"  quick search picks i={qi} c={qstep.level}: {qstep.throughput:.1f} infer/s, p99 {qstep.p99_ms:.2f} ms; "
          f"it measured {quick_cells} of {len(brute)} cells = {quick_cells / len(brute):.2f} (target <= 0.33)")
    same = brute[(qi, qstep.level)].throughput or 0.0
    print(f"  quick's pick as brute force measured that very cell: {same:.1f} infer/s = {same / best.throughput:.3f} "
          f"of brute's best (one table, so no run-to-run noise between the two; target >= 0.95)")
    ratios = head_to_head(model, name, shape, (bi, bc), (qi, qstep.level), rounds, settings, server_cpus)
    print(f"  the two picks re-measured in {rounds} interleaved rounds: quick's / brute's throughput median "
          f"{np.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}; target >= 0.95)")


def head_to_head(model: Path, name: str, shape: tuple[int, ...], a: tuple[int, int], b: tuple[int, int],
                 rounds: int, settings: MeasurementSettings, server_cpus: set[int] | None) -> list[float]:
    """Throughput ratios b/a of two (instances, concurrency) cells measured A, B, A, B ... (a fresh server
    each): a pick's own figure is the best of many noisy ones, so both are measured again side by side."""
    ratios = []
    for _ in range(rounds):
        tput = []
        for inst, conc in (a, b):
            with farm_server(model, threads=1, instances=inst, cpu_set=server_cpus) as url:
                tput.append(measure(url, name, shape, conc, settings, []).throughput or 0.0)
        ratios.append(tput[1] / tput[0] if tput[0] else float("nan"))
    return ratios


def batching_effect(model: Path, shape: tuple[int, ...], delay_us: int, rounds: int,
                    settings: MeasurementSettings, server_cpus: set[int] | None) -> None:
    """Throughput of batch-1 requests at concurrency 8 with and without dynamic batching, interleaved."""
    import tritonclient.grpc as tc

    ratios, p99s, sizes = [], {"off": [], "on": []}, []  # type: ignore[var-annotated]
    # arm -> [compute ns summed over requests, requests, executions, rows], the server's ModelStatistics: each
    # request is charged its whole batch's compute, so ns / requests is the compute of one execution
    compute: dict[str, list[int]] = {}
    with Steal() as st:
        for _ in range(rounds):
            tput = {}
            for arm, extra in (("off", ()), ("on", ("--max-queue-delay-us", str(delay_us)))):
                with farm_server(model, threads=1, cpu_set=server_cpus, extra=extra) as url:
                    step = measure(url, "input", shape, 8, settings, [])
                    stats = tc.InferenceServerClient(url).get_inference_statistics("model").model_stats[0]
                    acc = compute.setdefault(arm, [0, 0, 0, 0])
                    acc[0] += stats.inference_stats.compute_infer.ns
                    acc[1] += stats.inference_stats.compute_infer.count
                    acc[2] += stats.execution_count
                    acc[3] += stats.inference_count
                    if arm == "on":
                        sizes += [b.batch_size for b in stats.batch_stats for _ in range(b.compute_infer.count)]
                tput[arm] = step.throughput or 0.0
                p99s[arm].append(step.p99_ms)
            ratios.append(tput["on"] / tput["off"])
    r = np.array(ratios)
    print(f"\ndynamic batching, compute model, batch-1 requests at c=8, queue delay {delay_us} us vs off, "
          f"{rounds} interleaved rounds; host steal {st.pct:.1f} %{steal_flag(st.pct)}")
    print(f"  throughput ratio on/off: median {np.median(r):.3f} (min {r.min():.3f}, max {r.max():.3f}); "
          f"p99 median off {np.median(p99s['off']):.2f} ms, on {np.median(p99s['on']):.2f} ms")
    print("  the server's compute (ModelStatistics): " + "; ".join(
        f"{arm}: {ns / max(reqs, 1) / 1e6:.2f} ms per execution of {rows / max(n, 1):.2f} rows = "
        f"{ns / max(reqs, 1) / max(rows / max(n, 1), 1e-9) / 1e6:.3f} ms per row"
        for arm, (ns, reqs, n, rows) in sorted(compute.items())))
    if sizes:
        print(f"  executed batch sizes with batching: mean {np.mean(sizes):.2f}, median {np.median(sizes):g}, "
              f"max {max(sizes)} over {len(sizes)} executions")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small space and short windows (CI smoke run)")
    ap.add_argument("--only", choices=("search", "batching"), default=None, help="run one section")
    args = ap.parse_args()
    from farm.models.examples import build_example

    if args.quick:
        settings = MeasurementSettings(warmup_s=0.2, window_s=0.25, min_windows=3, max_windows=4)
        levels, instances, rounds, ms = [1, 2, 4, 8], [1], 1, 1.0
    else:  # farm's default measurement: 0.5 s warm-up, 1 s windows, 3 within ±10 % on throughput and mean latency
        settings = MeasurementSettings()
        levels, instances, rounds, ms = list(range(1, 17)), [1, 2], 5, 2.0
    client_cpus, server_cpus = split_cpus()
    pin(client_cpus)
    print(f"settings: warm-up {settings.warmup_s} s, {settings.window_s} s windows, {settings.min_windows} within "
          f"±{settings.stability_pct:g} % on throughput and {settings.stability_latency} latency (at most "
          f"{settings.max_windows}); client CPUs {sorted(client_cpus or [])}, "
          f"server CPUs {sorted(server_cpus or [])}; a shared noisy machine: figures are indicative")
    walls: list[float] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        compute = build_example("compute", tmp / "compute.onnx", ms=ms, calibrate=True)  # ~ms here
        ident = identity_model(tmp / "identity.onnx", (16,))
        if args.only != "batching":
            compare_search(f"compute-bound (MatMul chain, ~{ms:g} ms/sample)", compute, "input", (64, 256),
                           instances, levels, settings, server_cpus, walls, rounds)
            compare_search("transport-bound (Identity [1, 16])", ident, "x", (16,), instances, levels, settings,
                           server_cpus, walls, rounds)
            w = np.array(walls)
            print(f"\nwall time per measured configuration: median {np.median(w):.2f} s (p10 "
                  f"{np.percentile(w, 10):.2f}, p90 {np.percentile(w, 90):.2f}) over {len(w)} (target <= 5 s; "
                  "perf_analyzer's defaults: >= 15 s)")
        if args.only != "search":
            batching_effect(compute, (64, 256), 2000, rounds + 1, settings, server_cpus)

if __name__ == "__main__":
    main()

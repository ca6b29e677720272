"""Can `farm compare` be trusted across runs? Real A/A and A/B pairs of requests with repeats, judged by farm.

A is farm's ``compute`` example (a MatMul chain, compute-bound at batch 1); B is the same chain with 10 % more
layers (10 % more work per inference). Requests run through the real CLI in embedded mode, one after another:
A1, B1, A2, B2, ..., A(N+1). A/A pair i compares A(i) with A(i+1); A/B pair i compares A(i) with B(i). Each request
runs its one cell ``--repeats`` times (interleaving has nothing to interleave with one cell: the runs follow each
other).

Printed: pairs, wrong verdicts (A/A judged faster or slower), found slowdowns (A/B judged slower), the other
verdicts (same, inconclusive with their reasons) and the medians' change. The issue's targets: at most 5 % wrong
verdicts over at least 20 A/A pairs with 5 repeats, at least 90 % of the A/B slowdowns found.

Run: ``python benchmarks/trust.py [--quick] [--pairs N] [--repeats N] [--ms MS]``; ``--quick`` (CI): one pair
of each, 4 repeats (the fewest with which the test can reach p < 0.05), a 2 ms model, short windows; prints
figures, asserts nothing. Load: farm's own generator (``--client farm``), batch 1, concurrency 1.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from farm.models.examples import ASSUMED_GFLOPS, build_example, compute_layer_flops

#: short measurement settings per run (the tests' FAST): 0.2 s warm-up, windows of 0.3 s, at most 3
FAST = ["--warmup", "0.2", "--window", "0.3", "--windows", "3"]
#: farm's own load generator every time (no perf_analyzer needed; one client for every pair)
CLIENT = ["--client", "farm"]


def farm(env: dict[str, str], *args: str) -> str:
    """Run ``python -m farm ARGS`` in ``env``; its stdout (raises with its stderr on failure)."""
    proc = subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True, env=env,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"farm {' '.join(args)} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return proc.stdout


def models(out: Path, ms: float) -> tuple[Path, Path, tuple[int, int]]:
    """A (about ``ms`` ms per inference) and B (10 % more MatMul layers); their layer counts."""
    layer_ms = compute_layer_flops() / (ASSUMED_GFLOPS * 1e9) * 1e3
    layers_a = max(10, round(ms / layer_ms))  # 10 layers at least, so that +10 % is a whole layer
    layers_b = round(layers_a * 1.1)
    a = build_example("compute", out / "a.onnx", ms=layers_a * layer_ms)
    b = build_example("compute", out / "b.onnx", ms=layers_b * layer_ms)
    counts = tuple(len(onnx.load(str(p)).graph.node) for p in (a, b))
    return a, b, (counts[0], counts[1])


def submit(env: dict[str, str], model: Path, repeats: int, fast: bool) -> str:
    out = farm(env, "submit", str(model), "--repeats", str(repeats), "--json", *CLIENT, *(FAST if fast else []))
    return str(json.loads(out)["request_id"])


def judge(env: dict[str, str], a: str, b: str) -> dict[str, Any]:
    """The one match of ``farm compare A B --json``."""
    matches = json.loads(farm(env, "compare", a, b, "--json"))["matches"]
    return dict(matches[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one pair of each, 4 repeats, short windows (CI)")
    ap.add_argument("--pairs", type=int, default=None, help="A/A and A/B pairs each (default 20, quick 1)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per request (default 5, quick 4)")
    ap.add_argument("--ms", type=float, default=None, help="A's compute per inference, ms (about; default 5, "
                                                              "quick 2)")
    args = ap.parse_args()
    pairs = args.pairs or (1 if args.quick else 20)
    repeats = args.repeats or (4 if args.quick else 5)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="farm-trust-") as tmp:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("FARM_")}, "FARM_HOME": tmp}
        model_a, model_b, layers = models(Path(tmp), args.ms or (2.0 if args.quick else 5.0))
        a_ids, b_ids = [submit(env, model_a, repeats, args.quick)], []
        for _ in range(pairs):
            b_ids.append(submit(env, model_b, repeats, args.quick))
            a_ids.append(submit(env, model_a, repeats, args.quick))
        aa = [judge(env, a_ids[i], a_ids[i + 1]) for i in range(pairs)]
        ab = [judge(env, a_ids[i], b_ids[i]) for i in range(pairs)]
    report(aa, ab, layers, repeats, time.monotonic() - t0)


def report(aa: list[dict[str, Any]], ab: list[dict[str, Any]], layers: tuple[int, int], repeats: int,
           wall_s: float) -> None:
    """The table: per kind of pair, its count, verdicts and the medians' throughput change."""
    print(f"A: {layers[0]} MatMul layers, B: {layers[1]} (+{100 * (layers[1] / layers[0] - 1):.0f} % work); "
          f"{repeats} repeats per request; {wall_s:.0f} s in all")
    print(f"{'pairs':<6} {'kind':<5} {'wrong':>6} {'found':>6} {'same':>5} {'inconcl.':>8}  throughput change B/A "
          "(median of runs), per pair")
    for kind, matches in (("A/A", aa), ("A/B", ab)):
        v = Counter(m["verdict"] for m in matches)
        wrong = v["faster"] + v["slower"] if kind == "A/A" else v["faster"]
        found = "-" if kind == "A/A" else str(v["slower"])
        changes = " ".join(f"{100 * (m['ratios']['throughput'] - 1):+.1f}%" if m["ratios"]["throughput"] else "-"
                           for m in matches)
        print(f"{len(matches):<6} {kind:<5} {wrong:>6} {found:>6} {v['same']:>5} {v['inconclusive']:>8}  {changes}")
    reasons = Counter(m["reason"] for m in aa + ab if m["verdict"] == "inconclusive")
    for reason, n in reasons.items():
        print(f"inconclusive x{n}: {reason}")


if __name__ == "__main__":
    main()

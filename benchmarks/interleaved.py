"""Does `farm compare --interleaved` conclude on a noisy host, and is it right? Its calibration (issue 42), with the
plain `farm compare` over repeated runs beside it in the same run.

Models: A is farm's ``compute`` example (a chain of ``--layers`` MatMul layers, compute-bound at batch 1); B10 has
10 % more layers and B5 5 % more (a real slowdown: more work per inference, not a sleep). Three kinds of verdict:
A/A (A against a copy of itself), A/B10 and A/B5, taken round after round, in a shuffled order within each round.

- Interleaved: one ``farm compare --interleaved A X --json`` per verdict through the real CLI (closed loop,
  concurrency 1, one intra-op thread, blocks of ``--block-ms``, 100 ms), each within ``--budget-s`` (it stops
  sooner once conclusive).
- Plain: per round the requests A(i), B10(i), B5(i), A(i+1) with ``--repeats`` runs each (``farm submit``, farm's
  own generator), then ``farm compare`` A(i) A(i+1), A(i) B10(i), A(i) B5(i); a plain verdict's time is its two
  requests' plus the compare's.

Printed per kind and method: verdicts, wrong ones (A/A: slower or faster; A/B: faster), found slowdowns (A/B:
slower), same, inconclusive, the median change and detectable difference, and the time per verdict (median and
longest). The issue's targets: at most 5 % wrong over at least 20 A/A, at least 90 % of B10 found and 50 % of B5,
each verdict within 2 minutes.

Run: ``python benchmarks/interleaved.py [--quick] [--pairs N] [--plain-pairs N] [--budget-s S] [--layers N]``;
``--quick`` (CI): 1 verdict of each kind interleaved, 1 round of the plain compare with 2 repeats, a 10 s budget;
prints figures, asserts nothing. It loads the machine: run it under ``nice -n 19`` beside other work. The
requests and comparisons use a core-lock directory of their own, so that other farm users on the host do not make
them wait.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from trust import farm, submit
from trust import judge as plain_judge

from farm.models.examples import build_example, compute_layer_flops

KINDS = ("A/A", "A/B10", "A/B5")
#: how much more work each kind's NEW does
EXTRA = {"A/A": 0.0, "A/B10": 0.10, "A/B5": 0.05}


def models(out: Path, layers: int) -> dict[str, Path]:
    """A with ``layers`` MatMul layers, a copy of it (A/A), and the chains with 10 % and 5 % more layers."""
    flops_ms = compute_layer_flops() / 170e9 * 1e3  # examples' ms per layer at their assumed speed
    got = {"A": build_example("compute", out / "a.onnx", ms=layers * flops_ms)}
    shutil.copy(got["A"], out / "a_copy.onnx")
    got["A/A"] = out / "a_copy.onnx"
    for kind in ("A/B10", "A/B5"):
        got[kind] = build_example("compute", out / f"b{kind[3:]}.onnx", ms=round(layers * (1 + EXTRA[kind])) * flops_ms)
    return got


def interleaved(env: dict[str, str], a: Path, b: Path, budget_s: float, block_ms: float) -> dict[str, Any]:
    """One ``farm compare --interleaved`` verdict (its JSON, without the blocks), with its wall time."""
    t = time.monotonic()
    out = json.loads(farm(env, "compare", "--interleaved", str(a), str(b), "--threads", "1", "--budget-s",
                          str(budget_s), "--block-ms", str(block_ms), "--json"))
    out["blocks"] = len(out["blocks"])
    out["wall_s"] = time.monotonic() - t
    return out


def plain_round(env: dict[str, str], paths: dict[str, Path], a_id: str,
                repeats: int) -> tuple[str, list[dict[str, Any]]]:
    """One round of the plain compare: B10, B5 and the next A requested after ``a_id``; the next A's id and the
    three verdicts (kind, verdict, change, wall time: its two requests and the compare)."""
    took: dict[str, float] = {}
    ids: dict[str, str] = {}
    for kind in ("A/B10", "A/B5", "A/A"):
        t = time.monotonic()
        ids[kind] = submit(env, paths["A" if kind == "A/A" else kind], repeats, True)
        took[kind] = time.monotonic() - t
    verdicts = []
    for kind in KINDS:
        t = time.monotonic()
        m = plain_judge(env, a_id, ids[kind])
        thr = (m.get("ratios") or {}).get("throughput")
        verdicts.append({"kind": kind, "verdict": m["verdict"], "reason": m.get("reason"),
                         "change_pct": (1 / thr - 1) * 100 if thr else None,  # cost NEW/OLD, as interleaved
                         "wall_s": took[kind] + took["A/A"] + time.monotonic() - t})
    return ids["A/A"], verdicts


def tally(kind: str, got: list[dict[str, Any]]) -> str:
    """A table row: verdicts, wrong, found, same, inconclusive, median change, median detectable, time."""
    v = Counter(g["verdict"] for g in got)
    wrong = v["faster"] + v["slower"] if kind == "A/A" else v["faster"]
    found = "-" if kind == "A/A" else f"{v['slower']} ({100 * v['slower'] / max(1, len(got)):.0f} %)"
    changes = [g["change_pct"] for g in got if g.get("change_pct") is not None]
    detect = [g["detectable_pct"] for g in got if g.get("detectable_pct") is not None]
    walls = [g["wall_s"] for g in got]
    return (f"{len(got):>3} {wrong:>3} ({100 * wrong / max(1, len(got)):>3.0f} %) {found:>10} {v['same']:>4} "
            f"{v['inconclusive']:>6}  {_med(changes, '+.1f')} {_med(detect, '.1f')}  "
            f"{_med(walls, '.0f')} s (max {max(walls, default=0):.0f} s)")


def _med(values: list[float], fmt: str) -> str:
    return format(statistics.median(values), fmt).rjust(6) if values else "     -"


def report(results: dict[str, dict[str, list[dict[str, Any]]]], layers: int, wall_s: float) -> None:
    print(f"\nA: {layers} MatMul layers; B10 {round(layers * 1.1)}, B5 {round(layers * 1.05)}; {wall_s:.0f} s in all")
    print("method       kind    n wrong          found same incon.  change% detect%  time per verdict")
    for method, by_kind in results.items():
        for kind in KINDS:
            if by_kind[kind]:
                print(f"{method:<12} {kind:<6} {tally(kind, by_kind[kind])}")
    print("change: NEW's cost over OLD's, median over the verdicts (%); detect: the interleaved verdicts' "
          "minimum detectable difference (%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 verdict of each kind, 1 plain round (CI)")
    ap.add_argument("--pairs", type=int, default=None, help="interleaved verdicts of each kind (default 20, quick 1)")
    ap.add_argument("--plain-pairs", type=int, default=None, help="plain rounds (default --pairs, quick 1)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per plain request (default 5, quick 2)")
    ap.add_argument("--budget-s", type=float, default=None, help="interleaved budget per verdict, s (default 60, "
                                                                   "quick 10)")
    ap.add_argument("--block-ms", type=float, default=100.0, help="interleaved block length, ms (default 100)")
    ap.add_argument("--layers", type=int, default=40, help="A's MatMul layers (default 40, about 2 ms)")
    ap.add_argument("--seed", type=int, default=0, help="the order of the kinds within each round")
    args = ap.parse_args()
    n = args.pairs if args.pairs is not None else (1 if args.quick else 20)
    plain_n = args.plain_pairs if args.plain_pairs is not None else (1 if args.quick else n)
    repeats = args.repeats or (2 if args.quick else 5)
    budget = args.budget_s or (10.0 if args.quick else 60.0)
    rng = random.Random(args.seed)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {m: {k: [] for k in KINDS} for m in ("interleaved", "plain")}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="farm-interleaved-") as tmp:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("FARM_")}, "FARM_HOME": tmp,
               "FARM_HOST_LOCK_DIR": str(Path(tmp) / "locks"), "FARM_RUNNER": "process"}  # no image to build
        paths = models(Path(tmp), args.layers)
        a_id = submit(env, paths["A"], repeats, True) if plain_n else ""
        for i in range(max(n, plain_n)):
            kinds = list(KINDS)
            rng.shuffle(kinds)
            for kind in kinds if i < n else []:
                got = interleaved(env, paths["A"], paths[kind], budget, args.block_ms)
                results["interleaved"][kind].append(got)
                print(f"round {i + 1} interleaved {kind}: {got['verdict']} {got['change_pct']:+.1f} % "
                      f"(CI {got['ci_pct'][0]:+.1f} to {got['ci_pct'][1]:+.1f}, detectable {got['detectable_pct']:.1f} "
                      f"%), {got['pairs']} pairs, {got['wall_s']:.0f} s [{time.monotonic() - t0:.0f} s]", flush=True)
            if i < plain_n:
                try:
                    a_id, verdicts = plain_round(env, paths, a_id, repeats)
                except RuntimeError as exc:  # a failed request: the round is lost, not the run
                    print(f"round {i + 1} plain: failed: {str(exc)[-300:]}", flush=True)
                    a_id = submit(env, paths["A"], repeats, True)
                    continue
                for v in verdicts:
                    results["plain"][v["kind"]].append(v)
                print(f"round {i + 1} plain: " + "; ".join(f"{v['kind']} {v['verdict']} ({v['reason'] or '-'})"
                                                          for v in verdicts) + f" [{time.monotonic() - t0:.0f} s]",
                      flush=True)
    report(results, args.layers, time.monotonic() - t0)


if __name__ == "__main__":
    sys.exit(main())

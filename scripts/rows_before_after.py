#!/usr/bin/env python3
"""The same requests before and after a refactor (issue 37, point 7): each request is submitted on the embedded
default with the code of two commits, in interleaved rounds (before, after, before, after ...), and the rows are
compared: columns present in one and not the other, counts that must be equal (requests, tokens) and measured
values as the ratio after/before of their medians over the rounds, with the spread of each side.

    python3 scripts/rows_before_after.py --before b7b9a18 [--after HEAD] [--rounds 2]

A commit's code runs from a `git worktree` of it (PYTHONPATH first, so it wins over the installed farm); each
round has a FARM_HOME of its own. Prints a table; asserts nothing (figures depend on the host).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the requests compared: the README's demo (classic, served by farm's KServe server) and an LLM on llama-server
MODELS = {
    "bert-tiny": ["example-model", "{work}/demo.onnx", "--kind", "bert-tiny"],
    "tiny-llama": ["example-model", "{work}/llm", "--kind", "tiny-llama"],
}
REQUESTS = {
    "classic": ["submit", "{work}/demo.onnx", "--input", "input_ids:INT64:32", "--batch-sizes", "1,8",
                "--concurrency", "1,4", "--json"],
    "llm": ["submit", "{work}/llm/tiny-llama.gguf", "--engine", "llama.cpp", "--concurrency", "1,2",
            "--input-tokens", "32", "--output-tokens", "16", "--requests", "200", "--seed", "7", "--json"],
}
Row = dict[str, object]
Rows = dict[tuple[object, ...], Row]
KEY = ("engine", "batch_size", "concurrency")
# values that must be equal, not within noise: what was asked and counted
EXACT = ("status", "batch_size", "concurrency", "engine", "device", "protocol")
MEASURED = ("throughput_infer_per_s", "requests_per_s", "latency_p50_ms", "latency_p99_ms", "ttft_p50_ms",
            "output_tokens_per_s", "mean_input_tokens", "mean_output_tokens", "error_count", "cpu_pct_avg",
            "mem_peak_bytes")
NOISE = (0.75, 1.33)  # other numeric columns are listed only when after/before falls outside this


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A detached worktree of ``commit``, removed on exit."""
    path = Path(tempfile.mkdtemp(prefix=f"farm-{commit[:8]}-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(path), commit], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def farm(code: Path, home: Path, args: list[str]) -> str:
    """``farm ARGS`` with ``code`` first on sys.path and FARM_HOME=home; its stdout."""
    env = {**os.environ, "PYTHONPATH": str(code), "FARM_HOME": str(home)}
    env.setdefault("FARM_HOST_LOCK_DIR", str(home.parent / "host-locks"))  # cores leased apart from other farms here
    env.pop("FARM_DATABASE_URL", None)
    cmd = [sys.executable, "-c", "from farm.cli.main import main; main()", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"farm {' '.join(args[:2])} at {code}: exit {done.returncode}: {done.stderr[-800:]}")
    return done.stdout


def rows(code: Path, home: Path, request: list[str]) -> Rows:
    """One request submitted with ``code``; its rows by (engine, batch, concurrency)."""
    farm(code, home, request)
    out = json.loads(farm(code, home, ["results", "latest", "--format", "json"]))
    table = out["rows"] if isinstance(out, dict) else out
    return {tuple(r.get(k) for k in KEY): r for r in table}


def spread(values: list[float]) -> str:
    """median (min-max)."""
    return f"{statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})"


def compare(name: str, before: list[Rows], after: list[Rows]) -> None:
    """Print one request's comparison: columns, exact values, measured values as after/before ratios."""
    cols_b = set().union(*(r.keys() for rs in before for r in rs.values()))
    cols_a = set().union(*(r.keys() for rs in after for r in rs.values()))
    print(f"\n## {name}: {len(cols_b)} columns before, {len(cols_a)} after")
    print(f"   only before: {sorted(cols_b - cols_a) or '-'}")
    print(f"   only after:  {sorted(cols_a - cols_b) or '-'}")
    keys = sorted(set().union(*(rs.keys() for rs in before + after)), key=str)
    for key in keys:
        rb = [rs[key] for rs in before if key in rs]
        ra = [rs[key] for rs in after if key in rs]
        exact = [c for c in EXACT if {str(r.get(c)) for r in rb} != {str(r.get(c)) for r in ra}]
        print(f"   {key}: rounds {len(rb)}/{len(ra)}; exact columns differing: {exact or 'none'}")
        for col in MEASURED:
            vb, va = numbers(rb, col), numbers(ra, col)
            if not vb and not va:
                continue
            if not vb or not va:
                print(f"     {col:<22} before {spread(vb) if vb else '-'}  after {spread(va) if va else '-'}")
                continue
            ratio = statistics.median(va) / statistics.median(vb) if statistics.median(vb) else float("nan")
            print(f"     {col:<22} before {spread(vb):<26} after {spread(va):<26} after/before {ratio:.3f}")
        others(rb, ra)


def numbers(rows: list[Row], col: str) -> list[float]:
    """The column's numeric values over the rounds (bools and text left out)."""
    values = (r.get(col) for r in rows)
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def others(rb: list[Row], ra: list[Row]) -> None:
    """The numeric columns beyond MEASURED present on both sides: a count, and those whose medians differ beyond
    NOISE (or where one side is zero and the other not)."""
    common = sorted(set().union(*(r.keys() for r in rb)) & set().union(*(r.keys() for r in ra)) - set(MEASURED))
    off, n = [], 0
    for col in common:
        vb, va = numbers(rb, col), numbers(ra, col)
        if not vb or not va:
            continue
        n += 1
        mb, ma = statistics.median(vb), statistics.median(va)
        if (mb == 0) != (ma == 0) or (mb and not NOISE[0] <= ma / mb <= NOISE[1]):
            off.append(f"{col} {mb:.4g}->{ma:.4g}")
    print(f"     + {n} more numeric columns on both sides; outside {NOISE[0]}-{NOISE[1]}x: {', '.join(off) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="commit before the change")
    parser.add_argument("--after", default="HEAD", help="commit after the change")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per side (interleaved)")
    parser.add_argument("--only", choices=sorted(REQUESTS), help="one request only")
    args = parser.parse_args()
    names = [args.only] if args.only else list(REQUESTS)
    with worktree(args.before) as old, worktree(args.after) as new, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for argv in MODELS.values():  # the models are written once, by the newer code, and used by both
            farm(new, work / "models-home", [a.format(work=work) for a in argv])
        for name in names:
            request = [a.format(work=work) for a in REQUESTS[name]]
            got: dict[str, list[Rows]] = {"before": [], "after": []}
            sides = (("before", old), ("after", new))
            for i in range(args.rounds):
                for side, code in sides if i % 2 == 0 else sides[::-1]:
                    got[side].append(rows(code, work / f"{name}-{side}-{i}", request))
                    print(f"{name} round {i + 1} {side}: {len(got[side][-1])} rows", flush=True)
            compare(name, got["before"], got["after"])


if __name__ == "__main__":
    main()

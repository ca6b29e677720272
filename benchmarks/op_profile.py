"""Op profiles (issue 26): do the nodes account for the engine's compute time, and does --op-profile leave the
job's load figures alone?

1. **Sum vs compute.** For bert-tiny, resnet18 and a MiniLM-shaped encoder (all-MiniLM-L6-v2's shape: 6 layers,
   hidden 384, 12 heads, FFN 1536) on ONNX Runtime, OpenVINO and TorchScript: one profiling pass each
   (``python -m workers.profiling``, 1 thread, pinned to one core, as a served job's pass runs), the top 3 op
   types with their share of the node sum, the per-inference node sum against the engine's compute time (the
   same model without the profiler, interleaved with the profiled inferences in the same process).
   Target: sum within 10 % of compute; the remainder is the overhead row.
2. **The profiler never touches the figures.** Interleaved pairs of the same embedded job (mlp, process runner)
   without and with ``--op-profile`` (order alternating A B, B A, ...): the throughput ratio with / without,
   median and range over the pairs. Target: within the host's noise (the ratio's range straddles 1).

Run::

    python benchmarks/op_profile.py [--quick] [--pairs 5] [--iterations 20] [--seq 128]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from farm.models.examples import build_example  # noqa: E402
from farm.op_profile import by_op_type  # noqa: E402
from workers.profiling.process import PassOptions, pass_argv, pass_process  # noqa: E402

MINILM = {"hidden": 384, "layers": 6, "heads": 12, "ffn": 1536}
ENGINES = ("onnxruntime", "openvino", "torchscript")


def _models(d: Path, quick: bool) -> list[tuple[str, dict[str, Path], str]]:
    """(label, {engine: model file}, input JSON) per model; the TorchScript twins carry the same weights' shape."""
    out = []
    for label, kind, kw in (("bert-tiny", "bert-tiny", {}), ("resnet18", "resnet18", {}),
                            ("minilm-l6", "bert-tiny", MINILM)):
        if quick and label == "minilm-l6":
            continue
        onnx_path = build_example(kind, d / f"{label}.onnx", **kw)
        files = {"onnxruntime": onnx_path, "openvino": onnx_path}
        if not quick:
            files["torchscript"] = build_example(f"torchscript-{kind}", d / f"{label}.pt", **kw)
        out.append((label, files, ""))
    return out


def _inputs(label: str, seq: int) -> str:
    if label == "resnet18":
        return json.dumps([{"name": "input", "dtype": "FP32", "shape": [3, 224, 224]}])
    return json.dumps([{"name": "input_ids", "dtype": "INT64", "shape": [seq], "value_range": [0, 30000]}])


def sum_vs_compute(quick: bool, iterations: int, seq: int) -> list[dict[str, Any]]:
    core = {sorted(os.sched_getaffinity(0))[-1]}
    rows = []
    with tempfile.TemporaryDirectory(prefix="farm-bench-op-") as tmp:
        for label, files, _ in _models(Path(tmp), quick):
            for engine, path in files.items():
                out = Path(tmp) / f"{label}-{engine}"
                out.mkdir()
                argv = pass_argv(path, engine, 1, 1, "cpu", _inputs(label, seq), out, None, PassOptions(iterations))
                t = time.monotonic()
                prof, _ = pass_process(engine, argv, 600, core)
                if prof.status != "ok":
                    rows.append({"model": label, "engine": engine, "error": prof.reason})
                    continue
                types = [r for r in by_op_type(prof) if r["share"] is not None][:3]
                rows.append({"model": label, "engine": engine, "top3": [(r["op_type"], r["share"]) for r in types],
                             "node_sum_ms": prof.node_sum_ms, "compute_ms": prof.compute_ms,
                             "ratio": prof.sum_vs_compute, "nodes": len(prof.nodes), "wall_s": time.monotonic() - t})
    return rows


def _job(model: Path, home: Path, profile: bool, duration: float) -> dict[str, Any]:
    env = {**os.environ, "FARM_HOME": str(home), "FARM_RUNNER": "process", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "farm", "submit", str(model), "--duration", f"{duration:g}", "--warmup", "0.5",
            "--json", *(["--op-profile"] if profile else [])]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=True)
    (row,) = json.loads(out.stdout)["results"]
    return dict(row)


def pairs(n: int, duration: float) -> list[float]:
    """Throughput with / without --op-profile per interleaved pair."""
    ratios = []
    with tempfile.TemporaryDirectory(prefix="farm-bench-op-pairs-") as tmp:
        model = build_example("mlp", Path(tmp) / "mlp.onnx")
        for i in range(n):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {p: _job(model, Path(tmp) / f"home-{i}-{p}", p, duration) for p in order}
            ratios.append(got[True]["throughput_infer_per_s"] / got[False]["throughput_infer_per_s"])
            host = "; ".join(f"{'with' if p else 'without'}: host speed change {got[p].get('host_speed_change_pct')}"
                             f" %, foreign load {got[p].get('foreign_cpu_pct')} %" for p in (False, True))
            print(f"  pair {i + 1}: without {got[False]['throughput_infer_per_s']:.0f}/s, with "
                  f"{got[True]['throughput_infer_per_s']:.0f}/s, ratio {ratios[-1]:.3f} ({host})", flush=True)
    return ratios


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="bert-tiny and resnet18 on ORT and OpenVINO, 1 pair")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--seq", type=int, default=128)
    a = p.parse_args()
    iterations, seq, n, duration = (5, 32, 1, 1.0) if a.quick else (a.iterations, a.seq, a.pairs, 3.0)
    print(f"1. node sum vs compute (batch 1, 1 thread, one core; {iterations} profiled inferences; seq {seq})")
    print(f"{'model':10} {'engine':12} {'top 3 op types (share of node sum)':50} {'sum ms':>8} {'compute':>8} "
          f"{'sum/cmp':>7}")
    for r in sum_vs_compute(a.quick, iterations, seq):
        if "error" in r:
            print(f"{r['model']:10} {r['engine']:12} no profile: {r['error']}")
            continue
        top = ", ".join(f"{t} {100 * s:.0f}%" for t, s in r["top3"])
        print(f"{r['model']:10} {r['engine']:12} {top:50} {r['node_sum_ms']:8.3f} {r['compute_ms']:8.3f} "
              f"{r['ratio']:7.3f}", flush=True)
    print(f"\n2. throughput with / without --op-profile, {n} interleaved pair(s) of an mlp job ({duration:g} s)")
    ratios = pairs(n, duration)
    print(f"ratio median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f} "
          f"over {len(ratios)} pair(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

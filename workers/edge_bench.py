"""In-process edge benchmark: load one model, run a batch loop, print one JSON line.

Runs inside a constrained edge container (see ``workers.runners.docker_edge``), so it measures what
the model costs on that box: no server, no network, just the engine call.

Run::

    python -m workers.edge_bench --model /model/m.onnx --format onnx --batch-size 4 \
        --warmup-s 1 --duration-s 5 --threads 1 [--inputs '[{"name": "input", "dtype": "FP32",
        "shape": [256]}]']

Output (stdout, last line): ``{"edge_bench": 1, "metrics": {...}, ...}`` with metrics named as in
``schemas.metrics`` (latency_*_ms per batch call, throughput_infer_per_s in samples/s, requests_per_s in
batch calls/s, duration_s of the measured loop), plus ``iterations``, ``load_s``, ``warmup_iterations``
and the input shapes used. On a load or input error it prints ``{"edge_bench": 1, "error": "..."}``
and exits 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from schemas.engines import FORMAT_ENGINE
from workers.loadgen.stats import latency_metrics

MARKER = "edge_bench"


def make_inputs(model_inputs: list[Any], given: list[dict[str, Any]] | None, batch_size: int,
                seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for one batch. ``given`` (name, dtype, per-sample shape, optional ``value_range``
    [low, high] and ``zeros``) wins over the model's declared shapes; otherwise dynamic dims are 1 and the
    first dim is the batch."""
    from workers.engines.base import V2_TO_NP

    rng = np.random.default_rng(seed)
    by_name = {g["name"]: g for g in (given or [])}
    out: dict[str, np.ndarray] = {}
    for spec in model_inputs:
        g = by_name.get(spec.name)
        dtype_name = (g or {}).get("dtype") or spec.datatype or "FP32"
        if g is not None:
            shape = (batch_size, *[int(d) for d in g["shape"]])
        elif spec.shape:
            dims = [d if d > 0 else 1 for d in spec.shape]
            shape = (batch_size, *dims[1:])
        else:
            raise ValueError(f"input {spec.name!r} has no known shape; pass --inputs with its shape")
        dtype = V2_TO_NP.get(dtype_name)
        if dtype is None:
            raise ValueError(f"input {spec.name!r} has datatype {dtype_name}, which edge_bench cannot generate")
        low, high = (g or {}).get("value_range") or (0, 1 if dtype.kind == "f" else 9)
        if (g or {}).get("zeros"):
            arr = np.zeros(shape, dtype=dtype)
        elif dtype.kind == "f":
            arr = (low + (high - low) * rng.random(shape, dtype=np.float32)).astype(dtype)
        elif dtype.kind == "b":
            arr = rng.random(shape) < 0.5
        else:
            arr = rng.integers(int(low), int(high), size=shape, endpoint=True).astype(dtype)
        out[spec.name] = arr
    return out


def run(model: Path, model_format: str, engine: str | None, batch_size: int, warmup_s: float,
        duration_s: float, threads: int, inputs: list[dict[str, Any]] | None = None,
        device: str = "cpu") -> dict[str, Any]:
    """Load ``model`` and time ``backend.infer`` in a loop; returns the JSON-able report."""
    from workers.engines.backends import make_backend

    t0 = time.perf_counter()
    backend = make_backend(engine or FORMAT_ENGINE.get(model_format, "onnxruntime"))
    backend.load(model, device, threads)
    load_s = time.perf_counter() - t0
    feed = make_inputs(backend.inputs(), inputs, batch_size)
    try:
        warm = 0
        end = time.perf_counter() + warmup_s
        while True:  # at least one warm-up call: first-run allocations stay out of the figures
            backend.infer(feed)
            warm += 1
            if time.perf_counter() >= end:
                break
        lat_ms: list[float] = []
        start = time.perf_counter()
        end = start + duration_s
        while True:
            t = time.perf_counter_ns()
            backend.infer(feed)
            lat_ms.append((time.perf_counter_ns() - t) / 1e6)
            if time.perf_counter() >= end:
                break
        elapsed = time.perf_counter() - start
    finally:
        backend.close()
    return {
        MARKER: 1,
        "metrics": {**latency_metrics(lat_ms, batch_size, elapsed), "duration_s": elapsed},
        "iterations": len(lat_ms),
        "warmup_iterations": warm,
        "load_s": load_s,
        "batch_size": batch_size,
        "threads": threads,
        "inputs": {k: list(v.shape) for k, v in feed.items()},
    }


def parse_report(text: str) -> dict[str, Any] | None:
    """The last edge_bench JSON line in ``text`` (a container's stdout), or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and f'"{MARKER}"' in line:
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.edge_bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--format", dest="model_format", default="onnx", choices=sorted(FORMAT_ENGINE))
    p.add_argument("--engine", default=None, help="default: onnxruntime for onnx, torchscript for torchscript")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads, 0 = engine default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--inputs", default=None, help="JSON list of {name, dtype, shape (batch excluded)}")
    a = p.parse_args(argv)
    if a.batch_size < 1 or a.duration_s <= 0 or a.warmup_s < 0:
        p.error("--batch-size must be >= 1, --duration-s > 0 and --warmup-s >= 0")
    try:
        given = json.loads(a.inputs) if a.inputs else None
        report = run(a.model, a.model_format, a.engine, a.batch_size, a.warmup_s, a.duration_s,
                     a.threads, given, a.device)
    except Exception as exc:  # one JSON line either way: the runner reads the reason from it
        print(json.dumps({MARKER: 1, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 2
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

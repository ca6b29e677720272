"""In-process edge benchmark: load one model, run a batch loop, print one JSON line.

Runs inside a constrained edge container (see ``workers.runners.docker_edge``), so it measures what
the model costs on that box: no server, no network, just the engine call.

Run::

    python -m workers.edge_bench --model /model/m.onnx --format onnx --batch-size 4 \
        --warmup-s 0.5 --duration-s 5 --threads 1 [--inputs '[{"name": "input", "dtype": "FP32",
        "shape": [256]}]']

Output (stdout, last line): ``{"edge_bench": 1, "metrics": {...}, ...}`` with metrics named as in
``schemas.metrics`` (latency_*_ms per batch call, throughput_infer_per_s in samples/s, requests_per_s in
batch calls/s, duration_s of the measured loop), plus ``iterations``, ``load_s``, ``warmup_iterations``,
``warmup_s`` and the input shapes used. On a load or input error it prints ``{"edge_bench": 1, "error": "..."}``
and exits 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from schemas.engines import FORMAT_ENGINE
from schemas.input_data import InputData
from schemas.request import MEASUREMENT_DEFAULTS
from workers.engines.backends import make_backend
from workers.engines.inputs import make_inputs
from workers.loadgen.stats import latency_metrics
from workers.profiling.process import PASS_TIMEOUT_S, PassOptions, edge_profile_line, pass_argv, pass_process

MARKER = "edge_bench"


def run(model: Path, model_format: str, engine: str | None, batch_size: int, warmup_s: float,
        duration_s: float, threads: int, inputs: list[dict[str, Any]] | None = None,
        device: str = "cpu", data: InputData | None = None) -> dict[str, Any]:
    """Load ``model`` and time ``backend.infer`` in a loop; returns the JSON-able report."""
    t0 = time.perf_counter()
    backend = make_backend(engine or FORMAT_ENGINE.get(model_format, "onnxruntime"))
    backend.load(model, device, threads)
    load_s = time.perf_counter() - t0
    feed = make_inputs(backend.inputs(), inputs, batch_size, data=data)
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
        "warmup_s": warmup_s,
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
    p.add_argument("--warmup-s", type=float, default=MEASUREMENT_DEFAULTS["warmup_s"],
                   help="warm-up time, s (default: a job's, %(default)g)")
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads, 0 = engine default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--inputs", default=None, help="JSON list of {name, dtype, shape (batch excluded)}")
    p.add_argument("--input-data", type=Path, default=None,
                   help="the request's input data file as farm stores it (InputData JSON with its arrays)")
    p.add_argument("--op-profile", action="store_true",
                   help="after the measured loop (its line printed), an op-profiling pass in this box's limits")
    p.add_argument("--op-profile-iterations", type=int, default=PassOptions.iterations)
    p.add_argument("--op-profile-max-events", type=int, default=PassOptions.max_events)
    p.add_argument("--op-profile-abort", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.batch_size < 1 or a.duration_s <= 0 or a.warmup_s < 0:
        p.error("--batch-size must be >= 1, --duration-s > 0 and --warmup-s >= 0")
    try:
        given = json.loads(a.inputs) if a.inputs else None
        data = InputData.model_validate_json(a.input_data.read_bytes()) if a.input_data else None
        report = run(a.model, a.model_format, a.engine, a.batch_size, a.warmup_s, a.duration_s,
                     a.threads, given, a.device, data)
    except Exception as exc:  # one JSON line either way: the runner reads the reason from it
        print(json.dumps({MARKER: 1, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 2
    print(json.dumps(report), flush=True)
    if a.op_profile:  # after the figures are out: a crash or OOM of the pass cannot take them along
        engine = a.engine or FORMAT_ENGINE.get(a.model_format, "onnxruntime")
        print(json.dumps(edge_op_profile(engine, a, report["metrics"].get("latency_p50_ms"))), flush=True)
    return 0


def edge_op_profile(engine: str, a: argparse.Namespace, compute_ms: float | None) -> dict[str, Any]:
    """The op profile of this edge run as one JSON line (``workers.profiling.job.edge_profile``): a child
    process in the same container/cgroup (the same CPU and memory limits) loads the model once, profiled; the
    engine's compute time is this run's own p50."""
    with tempfile.TemporaryDirectory(prefix="farm-op-profile-") as tmp:
        opts = PassOptions(a.op_profile_iterations, a.op_profile_max_events, a.op_profile_abort)
        argv = pass_argv(a.model, engine, a.batch_size, a.threads, a.device, a.inputs or "[]", Path(tmp),
                         a.input_data, opts, compute_ms)
        prof, trace = pass_process(engine, argv, PASS_TIMEOUT_S)
    return edge_profile_line(prof, trace)


if __name__ == "__main__":
    sys.exit(main())

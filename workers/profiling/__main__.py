"""One op-profiling pass as a process (``workers.profiling.job`` starts it on the job's cores).

Run::

    python -m workers.profiling --model m.onnx --engine onnxruntime --batch-size 4 --threads 1 --out DIR

Output (stdout, last line): ``{"op_profile": 1, "profile": {...}, "trace": "DIR/..."}`` (``schemas.op_profile
.OpProfile``), or ``{"op_profile": 1, "error": "..."}`` with exit status 2 when the pass failed.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from schemas.input_data import InputData
from schemas.op_profile import MAX_EVENTS, PROFILE_ITERATIONS, PROFILE_WARMUP
from workers.profiling.run import run_pass

MARKER = "op_profile"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.profiling", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--engine", required=True)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads, 0 = one per core of this process")
    p.add_argument("--device", default="cpu")
    p.add_argument("--inputs", default=None, help="JSON list of {name, dtype, shape (batch excluded)}")
    p.add_argument("--input-data", type=Path, default=None, help="the request's input data file (InputData JSON)")
    p.add_argument("--warmup", type=int, default=PROFILE_WARMUP)
    p.add_argument("--iterations", type=int, default=PROFILE_ITERATIONS)
    p.add_argument("--max-events", type=int, default=MAX_EVENTS)
    p.add_argument("--out", type=Path, required=True, help="directory for the raw trace")
    p.add_argument("--abort", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compute-ms", type=float, default=None,
                   help="the engine call's time measured already (an edge run's p50), ms: load the model once")
    a = p.parse_args(argv)
    if a.batch_size < 1 or a.iterations < 1 or a.warmup < 0 or a.max_events < 1:
        p.error("--batch-size, --iterations and --max-events must be >= 1 and --warmup >= 0")
    if a.abort:  # TEST HARNESS (the worker's FARM_OP_PROFILE_CRASH=1): a real crash of this process
        os.abort()
    try:
        data = InputData.model_validate_json(a.input_data.read_bytes()) if a.input_data else None
        prof, trace = run_pass(a.model, a.engine, a.batch_size, a.threads, a.out,
                               inputs=json.loads(a.inputs) if a.inputs else None, device=a.device, data=data,
                               warmup=a.warmup, iterations=a.iterations, max_events=a.max_events,
                               compute_ms=a.compute_ms)
    except Exception as exc:  # one JSON line either way: the job reads the reason from it
        print(json.dumps({MARKER: 1, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 2
    print(json.dumps({MARKER: 1, "profile": prof.model_dump(), "trace": str(trace) if trace else None}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

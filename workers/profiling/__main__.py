"""One op-profiling pass as a process (``workers.profiling.job`` starts it on the job's cores).

Run::

    python -m workers.profiling --model m.onnx --engine onnxruntime --batch-size 4 --threads 1 --out DIR

Output: ``{"op_profile": 1, "profile": {...}, "trace": "DIR/..."}`` (``schemas.op_profile.OpProfile``), or
``{"op_profile": 1, "error": "..."}`` with exit status 2 when the pass failed, written to the pass's own channel:
the inherited descriptor ``--result-fd N`` or the new file ``--result-file PATH`` (stdout without either). The
model's code may print on stdout; the worker never reads the report from there (``workers.profiling.process``).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from schemas.input_data import InputData
from schemas.op_profile import MAX_EVENTS, PROFILE_ITERATIONS, PROFILE_WARMUP
from workers.profiling.process import MARKER
from workers.profiling.run import run_pass


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
    p.add_argument("--result-fd", type=int, default=None, help="the descriptor the report is written to")
    p.add_argument("--result-file", type=Path, default=None, help="a new file the report is written to")
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
        _report(a, {MARKER: 1, "error": f"{type(exc).__name__}: {exc}"})
        return 2
    _report(a, {MARKER: 1, "profile": prof.model_dump(), "trace": str(trace.resolve()) if trace else None})
    return 0


def _report(a: argparse.Namespace, report: dict[str, object]) -> None:
    """Write ``report`` to the pass's own channel (see the module docstring)."""
    data = (json.dumps(report) + "\n").encode()
    if a.result_fd is not None:
        with os.fdopen(a.result_fd, "wb") as f:
            f.write(data)
    elif a.result_file is not None:
        fd = os.open(a.result_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    else:
        print(data.decode(), end="", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

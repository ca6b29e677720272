"""The jailed side of a model's parse, dry run or analysis (``farm.sandbox.run_jailed``): run inside the jail as
``python -m farm.models.probe inspect|analyze MODEL INPUTS_JSON`` (``INPUTS_JSON``: the given inputs as a
JSON list of TensorSpec objects, or ``null``); prints one JSON object (the result, or ``{"error", "kind"}``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.models.torch_counter import analyze_torchscript_here
from farm.models.torchscript import inspect_torchscript_here, probe_args
from schemas import TensorSpec

__all__ = ["main", "probe_args"]


def _run(op: str, path: Path, inputs: list[TensorSpec] | None) -> dict[str, Any]:
    if op == "inspect":
        return inspect_torchscript_here(path, inputs).to_json()
    if op == "analyze":
        return analyze_torchscript_here(path, inputs or [])
    raise FarmError(f"unknown probe {op!r}")


def main(argv: list[str]) -> int:
    op, path, given = argv
    raw = json.loads(given)
    inputs = None if raw is None else [TensorSpec.model_validate(t) for t in raw]
    try:
        out = _run(op, Path(path), inputs)
    except FarmError as exc:
        out = {"error": str(exc), "kind": type(exc).__name__}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The jailed side of a model's parse, dry run or analysis (``farm.sandbox.run_jailed``): run inside the jail as
``python -m farm.models.probe inspect|analyze|report|layers MODEL INPUTS_JSON [BATCH]`` (``report``:
``farm.models.analysis``'s whole report, the check included; ``layers``: ``farm.models.torch_layers`` at BATCH;
``INPUTS_JSON``: the given inputs as a JSON list of TensorSpec objects, or ``null``); prints one JSON object (the
result, or ``{"error", "kind"}``)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.models.analysis import analyze_here
from farm.models.torch_counter import analyze_torchscript_here
from farm.models.torch_layers import layers_json
from farm.models.torchscript import inspect_torchscript_here
from farm.settings import reset_settings
from schemas import TensorSpec


def _run(op: str, path: Path, inputs: list[TensorSpec] | None, batch: int) -> dict[str, Any]:
    if op == "layers":
        return dict(layers_json(path, inputs or [], batch))
    if op == "inspect":
        return inspect_torchscript_here(path, inputs).to_json()
    if op == "analyze":
        return analyze_torchscript_here(path, inputs or [])
    if op == "report":
        return analyze_here(path, None, inputs)
    raise FarmError(f"unknown probe {op!r}")


def main(argv: list[str]) -> int:
    os.environ["FARM_TRUSTED_MODELS"] = "1"  # inside the jail already: what it loads runs here, not in one more
    reset_settings()
    op, path, given, *rest = argv
    raw = json.loads(given)
    inputs = None if raw is None else [TensorSpec.model_validate(t) for t in raw]
    try:
        out = _run(op, Path(path), inputs, int(rest[0]) if rest else 1)
    except FarmError as exc:
        out = {"error": str(exc), "kind": type(exc).__name__}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

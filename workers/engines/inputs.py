"""One batch of a model's inputs for an in-process engine call (the edge benchmark and the op-profiling pass),
drawn by farm's one input generator (``farm.input_data``) exactly as a served job of the same request sends it."""
from __future__ import annotations

from typing import Any

import numpy as np

from farm.input_data import input_tensors
from schemas import TensorSpec
from schemas.dtypes import DTYPES
from schemas.input_data import InputData


def make_inputs(model_inputs: list[Any], given: list[dict[str, Any]] | None, batch_size: int,
                seed: int = 0, data: InputData | None = None) -> dict[str, np.ndarray]:
    """One batch of every model input, drawn by farm's one input generator (``farm.input_data``) exactly as
    a served job of the same request sends it: ``given`` (the job's inputs: name, dtype, per-sample shape,
    optional ``value_range`` [low, high] and ``zeros``) in its order, the i-th with ``seed + i``; a model
    input not given takes its declared shape (dynamic dims 1, the first dim the batch) and the seeds after
    them."""
    given = list(given or [])
    names = {g["name"] for g in given}
    specs = [TensorSpec(name=g["name"], dtype=g.get("dtype") or "FP32", shape=tuple(int(d) for d in g["shape"]),
                        value_range=g.get("value_range")) for g in given]
    specs += [_declared(spec) for spec in model_inputs if spec.name not in names]
    if data is None and any(g.get("zeros") for g in given):
        data = InputData(kind="zeros")
    feed = input_tensors(specs, batch_size, data, seed=seed)
    return {spec.name: feed[spec.name] for spec in model_inputs}


def _declared(spec: Any) -> TensorSpec:
    """A model input the job did not describe, as the model declares it (``IOSpec``: name, datatype, shape
    with the batch first; dynamic dims become 1)."""
    dtype = spec.datatype or "FP32"
    if dtype not in DTYPES:
        raise ValueError(f"input {spec.name!r} has datatype {dtype}, which edge_bench cannot generate")
    if not spec.shape:
        raise ValueError(f"input {spec.name!r} has no known shape; pass --inputs with its shape")
    return TensorSpec(name=spec.name, dtype=dtype, shape=tuple(d if d > 0 else 1 for d in spec.shape[1:]))

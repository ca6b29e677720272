"""Build the KServe v2 ModelInfer request once: random tensors of each input's dtype and shape."""
from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from schemas import TensorSpec
from schemas.dtypes import DTYPES, V2_NUMPY_NAME

# KServe v2 datatype -> numpy dtype (little-endian, as the protocol's raw contents are), for each
# datatype a TensorSpec accepts.
V2_NUMPY: dict[str, np.dtype] = {name: np.dtype(V2_NUMPY_NAME[name]).newbyteorder("<") for name in DTYPES}


def random_tensor(spec: TensorSpec, batch_size: int, seed: int = 0) -> np.ndarray:
    """Random data of ``spec``'s dtype, shape ``(batch_size, *spec.shape)``.

    Floats are uniform in [0, 1); integers in [0, 100) (small, so index-like inputs stay valid);
    booleans are fair coin flips. The same ``seed`` gives the same data.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dtype = V2_NUMPY.get(spec.dtype)
    if dtype is None:
        raise ValueError(f"dtype {spec.dtype!r} has no numpy equivalent; allowed: {', '.join(V2_NUMPY)}")
    rng = np.random.default_rng(seed)
    shape = (batch_size, *spec.shape)
    if dtype.kind == "f":
        return rng.random(shape, dtype=np.float64).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.integers(0, 100, size=shape).astype(dtype)


def build_request(model_name: str, inputs: list[TensorSpec], batch_size: int,
                  seed: int = 0) -> pb.ModelInferRequest:
    """The ModelInferRequest for ``model_name``: one random tensor per input, sent as raw contents."""
    if not inputs:
        raise ValueError("inputs must name at least one tensor (name, dtype, shape without batch)")
    req = pb.ModelInferRequest(model_name=model_name)
    for i, spec in enumerate(inputs):
        arr = random_tensor(spec, batch_size, seed=seed + i)
        tensor = req.inputs.add()
        tensor.name = spec.name
        tensor.datatype = spec.dtype
        tensor.shape.extend(arr.shape)
        req.raw_input_contents.append(arr.tobytes())
    return req


def serialized_request(model_name: str, inputs: list[TensorSpec], batch_size: int, seed: int = 0) -> bytes:
    """:func:`build_request` serialized once; the generator sends these same bytes for every request."""
    return build_request(model_name, inputs, batch_size, seed).SerializeToString()

"""Build the KServe v2 ModelInfer request once: a tensor of each input's dtype and shape, from random
values (within the input's value range), zeros, or a data file's rows (cycled to fill the batch)."""
from __future__ import annotations

import base64

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from schemas import TensorSpec
from schemas.dtypes import DTYPES, V2_NUMPY_NAME
from schemas.input_data import InputData

# KServe v2 datatype -> numpy dtype (little-endian, as the protocol's raw contents are), for each
# datatype a TensorSpec accepts.
#: most distinct requests built from a data file (its further rows are left out)
MAX_DISTINCT_REQUESTS = 256
V2_NUMPY: dict[str, np.dtype] = {name: np.dtype(V2_NUMPY_NAME[name]).newbyteorder("<") for name in DTYPES}


def random_tensor(spec: TensorSpec, batch_size: int, seed: int = 0) -> np.ndarray:
    """Random data of ``spec``'s dtype, shape ``(batch_size, *spec.shape)``.

    Floats are uniform in [0, 1); integers in [0, 100) (small, so index-like inputs stay valid);
    booleans are fair coin flips. ``spec.value_range`` (low, high) replaces the range: floats uniform in
    [low, high), integers in [low, high] both included. The same ``seed`` gives the same data.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dtype = V2_NUMPY.get(spec.dtype)
    if dtype is None:
        raise ValueError(f"dtype {spec.dtype!r} has no numpy equivalent; allowed: {', '.join(V2_NUMPY)}")
    rng = np.random.default_rng(seed)
    shape = (batch_size, *spec.shape)
    low, high = spec.value_range or (0.0, 1.0 if dtype.kind == "f" else 99.0)
    if dtype.kind == "f":
        return (low + (high - low) * rng.random(shape, dtype=np.float64)).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.integers(int(low), int(high), size=shape, endpoint=True).astype(dtype)


def input_tensor(spec: TensorSpec, batch_size: int, data: InputData | None, seed: int = 0,
                 first_row: int = 0) -> np.ndarray:
    """The tensor sent for ``spec``: random (``data`` None or ``random``), zeros, or the file's rows in
    order from ``first_row``, cycled past the file's end."""
    if data is None or data.kind == "random":
        return random_tensor(spec, batch_size, seed)
    dtype = V2_NUMPY[spec.dtype]
    if data.kind == "zeros":
        return np.zeros((batch_size, *spec.shape), dtype=dtype)
    arr = (data.arrays or {}).get(spec.name)
    if arr is None:
        raise ValueError(f"the input data file has no array for input {spec.name!r}")
    rows = np.frombuffer(base64.b64decode(arr.b64), dtype=V2_NUMPY[arr.dtype]).reshape(arr.shape)
    if tuple(rows.shape[1:]) != tuple(spec.shape) or arr.dtype != spec.dtype:
        raise ValueError(f"the input data of {spec.name!r} has rows of {list(rows.shape[1:])} {arr.dtype}, "
                         f"the model expects {list(spec.shape)} {spec.dtype}")
    return np.ascontiguousarray(rows[(first_row + np.arange(batch_size)) % rows.shape[0]])


def build_request(model_name: str, inputs: list[TensorSpec], batch_size: int,
                  seed: int = 0, data: InputData | None = None, first_row: int = 0) -> pb.ModelInferRequest:
    """The ModelInferRequest for ``model_name``: one tensor per input (see :func:`input_tensor`), sent
    as raw contents."""
    if not inputs:
        raise ValueError("inputs must name at least one tensor (name, dtype, shape without batch)")
    req = pb.ModelInferRequest(model_name=model_name)
    for i, spec in enumerate(inputs):
        arr = input_tensor(spec, batch_size, data, seed=seed + i, first_row=first_row)
        tensor = req.inputs.add()
        tensor.name = spec.name
        tensor.datatype = spec.dtype
        tensor.shape.extend(arr.shape)
        req.raw_input_contents.append(arr.tobytes())
    return req


def serialized_request(model_name: str, inputs: list[TensorSpec], batch_size: int, seed: int = 0,
                       data: InputData | None = None) -> bytes:
    """:func:`build_request` serialized once; the generator sends these same bytes for every request."""
    return build_request(model_name, inputs, batch_size, seed, data).SerializeToString()


def request_count(batch_size: int, data: InputData | None) -> int:
    """How many distinct requests are sent in turn: one, or for a data file enough to send each of its
    rows (request k starts at row ``k * batch_size``), at most :data:`MAX_DISTINCT_REQUESTS`."""
    rows = max((a.shape[0] if a.shape else 1 for a in (data.arrays or {}).values()), default=1) \
        if data is not None and data.kind == "file" else 1
    return min(MAX_DISTINCT_REQUESTS, max(1, -(-rows // batch_size)))


def serialized_requests(model_name: str, inputs: list[TensorSpec], batch_size: int, seed: int = 0,
                        data: InputData | None = None) -> list[bytes]:
    """The requests the generator sends in turn (:func:`request_count` of them), serialized."""
    return [build_request(model_name, inputs, batch_size, seed, data, k * batch_size).SerializeToString()
            for k in range(request_count(batch_size, data))]

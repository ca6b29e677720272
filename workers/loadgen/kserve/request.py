"""Build the KServe v2 ModelInfer request once: a tensor of each input's dtype and shape, from random
values (within the input's value range), zeros, or a data file's rows (cycled to fill the batch)."""
from __future__ import annotations

from tritonclient.grpc import service_pb2 as pb

from farm.input_data import V2_NUMPY as V2_NUMPY  # the tensors come from farm's one input generator
from farm.input_data import input_tensor as input_tensor
from farm.input_data import input_tensors
from farm.input_data import random_tensor as random_tensor
from schemas import TensorSpec
from schemas.input_data import InputData

#: most distinct requests built from a data file (its further rows are left out)
MAX_DISTINCT_REQUESTS = 256


def build_request(model_name: str, inputs: list[TensorSpec], batch_size: int,
                  seed: int = 0, data: InputData | None = None, first_row: int = 0) -> pb.ModelInferRequest:
    """The ModelInferRequest for ``model_name``: one tensor per input (see :func:`input_tensor`), sent
    as raw contents."""
    if not inputs:
        raise ValueError("inputs must name at least one tensor (name, dtype, shape without batch)")
    req = pb.ModelInferRequest(model_name=model_name)
    tensors = input_tensors(inputs, batch_size, data, seed=seed, first_row=first_row)
    for spec in inputs:
        arr = tensors[spec.name]
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

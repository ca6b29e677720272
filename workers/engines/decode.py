"""Turning a KServe v2 inference request into numpy inputs for a backend, with the checks a client needs
to hear about (names, datatypes, shapes, byte counts). Used by the built-in server."""
from __future__ import annotations

import math

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from schemas.dtypes import TYPED_CONTENTS
from workers.engines.base import V2_TO_NP, InputError, IOSpec


def decode_inputs(req: pb.ModelInferRequest, specs: dict[str, IOSpec]) -> dict[str, np.ndarray]:
    """The request's tensors as numpy arrays (raw bytes are viewed, not copied), checked against the
    model's inputs ``specs`` (name -> IOSpec); InputError, with a message for the client, if unfit."""
    raw = req.raw_input_contents
    if raw and len(raw) != len(req.inputs):
        raise InputError(
            f"request has {len(req.inputs)} inputs but {len(raw)} raw_input_contents; send one per input"
        )
    feed: dict[str, np.ndarray] = {}
    for i, t in enumerate(req.inputs):
        name = t.name
        spec = specs.get(name)
        if spec is None:
            raise InputError(f"unknown input {name!r}; the model's inputs are {', '.join(specs)}")
        if name in feed:
            raise InputError(f"input {name!r} appears twice in the request")
        np_dt, shape = _checked_type(t, spec)
        feed[name] = _from_raw(t, np_dt, shape, raw[i]) if raw else _from_contents(t, np_dt, shape)
    if len(feed) != len(specs):
        missing = [n for n in specs if n not in feed]
        raise InputError(f"missing input(s) {', '.join(missing)}; the model needs all of {', '.join(specs)}")
    return feed


def _checked_type(t: pb.ModelInferRequest.InferInputTensor, spec: IOSpec) -> tuple[np.dtype, tuple[int, ...]]:
    """The numpy dtype and shape of input ``t``, checked against the model's ``spec``."""
    name, dt = t.name, t.datatype
    if spec.datatype and dt != spec.datatype:
        raise InputError(f"input {name!r} has datatype {dt}, the model expects {spec.datatype}")
    np_dt = V2_TO_NP.get(dt)
    if np_dt is None:
        raise InputError(
            f"input {name!r}: datatype {dt!r} is not supported; use one of {', '.join(V2_TO_NP)}"
        )
    shape = tuple(t.shape)
    if spec.shape is not None:
        if len(shape) != len(spec.shape) or any(e != -1 and e != s for e, s in zip(spec.shape, shape, strict=True)):
            raise InputError(
                f"input {name!r} has shape {list(shape)}, the model expects {list(spec.shape)} (-1 = any)"
            )
    if any(s < 0 for s in shape):
        raise InputError(f"input {name!r} has a negative dimension in shape {list(shape)}")
    return np_dt, shape


def _from_raw(t: pb.ModelInferRequest.InferInputTensor, np_dt: np.dtype, shape: tuple[int, ...],
              buf: bytes) -> np.ndarray:
    """Input ``t`` from its raw bytes ``buf`` (a view, not a copy)."""
    count = math.prod(shape)
    if len(buf) != count * np_dt.itemsize:
        raise InputError(
            f"input {t.name!r}: {len(buf)} raw bytes do not match shape {list(shape)} of {t.datatype} "
            f"({count * np_dt.itemsize} bytes expected)"
        )
    return np.frombuffer(buf, dtype=np_dt).reshape(shape)


def _from_contents(t: pb.ModelInferRequest.InferInputTensor, np_dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Input ``t`` from its typed ``contents`` field."""
    name, dt = t.name, t.datatype
    field = TYPED_CONTENTS.get(dt)
    if field is None:
        raise InputError(f"input {name!r}: datatype {dt} must be sent in raw_input_contents")
    values = getattr(t.contents, field)
    if len(values) != math.prod(shape):
        raise InputError(
            f"input {name!r}: {len(values)} values in contents.{field} do not match shape {list(shape)}"
        )
    try:
        return np.asarray(values, dtype=np_dt).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise InputError(f"input {name!r}: contents.{field} do not fit {dt}: {exc}") from None

"""Turning a KServe v2 inference request into numpy inputs for a backend, with the checks a client needs
to hear about (names, datatypes, shapes, byte counts). Used by the built-in server."""
from __future__ import annotations

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
        dt = t.datatype
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
        count = 1
        for s in shape:
            count *= s
        if raw:
            buf = raw[i]
            if len(buf) != count * np_dt.itemsize:
                raise InputError(
                    f"input {name!r}: {len(buf)} raw bytes do not match shape {list(shape)} of {dt} "
                    f"({count * np_dt.itemsize} bytes expected)"
                )
            arr = np.frombuffer(buf, dtype=np_dt).reshape(shape)
        else:
            field = TYPED_CONTENTS.get(dt)
            if field is None:
                raise InputError(f"input {name!r}: datatype {dt} must be sent in raw_input_contents")
            values = getattr(t.contents, field)
            if len(values) != count:
                raise InputError(
                    f"input {name!r}: {len(values)} values in contents.{field} do not match shape {list(shape)}"
                )
            try:
                arr = np.asarray(values, dtype=np_dt).reshape(shape)
            except (OverflowError, ValueError) as exc:
                raise InputError(f"input {name!r}: contents.{field} do not fit {dt}: {exc}") from None
        feed[name] = arr
    if len(feed) != len(specs):
        missing = [n for n in specs if n not in feed]
        raise InputError(f"missing input(s) {', '.join(missing)}; the model needs all of {', '.join(specs)}")
    return feed

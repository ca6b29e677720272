"""Tensor datatypes, declared once: KServe v2 name, numpy/ONNX/ONNX Runtime/torch twins, wire field.

Every dtype table of farm (model inspection, the engines, the built-in server's decoder, the load
generator, Triton's model config) derives from :data:`TABLE`. Also the one grammar of an input spec
(``NAME[:DTYPE]:SHAPE``, :func:`parse_input_spec`) and the dtype aliases users may type (``float32``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class DType:
    """One KServe v2 datatype and its twins; None where the other side has none.

    ``contents`` is the ``InferTensorContents``
    field carrying it (None: raw contents only); ``requestable``: a ``TensorSpec`` may use it (farm
    generates data for it and inspects models with it).
    """

    name: str
    numpy: str | None
    onnx: int
    ort: str
    torch: str | None
    contents: str | None
    requestable: bool


_D = DType
TABLE: tuple[DType, ...] = (
    _D("FP32", "float32", 1, "tensor(float)", "float32", "fp32_contents", True),
    _D("FP16", "float16", 10, "tensor(float16)", "float16", None, True),
    _D("FP64", "float64", 11, "tensor(double)", "float64", "fp64_contents", True),
    _D("INT8", "int8", 3, "tensor(int8)", "int8", "int_contents", True),
    _D("INT16", "int16", 5, "tensor(int16)", "int16", "int_contents", True),
    _D("INT32", "int32", 6, "tensor(int32)", "int32", "int_contents", True),
    _D("INT64", "int64", 7, "tensor(int64)", "int64", "int64_contents", True),
    _D("UINT8", "uint8", 2, "tensor(uint8)", "uint8", "uint_contents", True),
    _D("BOOL", "bool", 9, "tensor(bool)", "bool", "bool_contents", True),
    # served by the engines (model outputs, requests of other clients) but not requestable
    _D("UINT16", "uint16", 4, "tensor(uint16)", None, "uint_contents", False),
    _D("UINT32", "uint32", 12, "tensor(uint32)", None, "uint_contents", False),
    _D("UINT64", "uint64", 13, "tensor(uint64)", None, "uint64_contents", False),
    # no fixed-width numpy twin: neither served by the built-in server nor requestable
    _D("BF16", None, 16, "tensor(bfloat16)", None, None, False),
    _D("BYTES", None, 8, "tensor(string)", None, None, False),
)

BY_NAME: dict[str, DType] = {d.name: d for d in TABLE}
#: the datatypes a TensorSpec accepts
DTYPES: tuple[str, ...] = tuple(d.name for d in TABLE if d.requestable)
#: KServe v2 datatype -> numpy dtype name, for every datatype with a fixed-width numpy twin
V2_NUMPY_NAME: dict[str, str] = {d.name: d.numpy for d in TABLE if d.numpy is not None}
ONNX_TO_V2: dict[int, str] = {d.onnx: d.name for d in TABLE}
ORT_TO_V2: dict[str, str] = {d.ort: d.name for d in TABLE}
TORCH_TO_V2: dict[str, str] = {d.torch: d.name for d in TABLE if d.torch is not None}
TYPED_CONTENTS: dict[str, str] = {d.name: d.contents for d in TABLE if d.contents is not None}

#: names users may type for a datatype (case-insensitive), besides the datatype itself
ALIASES: dict[str, str] = {
    "FLOAT": "FP32", "FLOAT32": "FP32", "F32": "FP32", "HALF": "FP16", "FLOAT16": "FP16", "F16": "FP16",
    "DOUBLE": "FP64", "FLOAT64": "FP64", "F64": "FP64", "LONG": "INT64", "INT": "INT32", "BYTE": "UINT8",
}

INPUT_SPEC_HINT = "use NAME:DTYPE:SHAPE, e.g. input:FP32:3x224x224 (shape without the batch dimension)"
_DIM_RE = re.compile(r"[+-]?\d+")


def normalize_dtype(text: str) -> str:
    """``fp32``/``float32``/``float`` -> ``FP32``: a datatype with a numpy twin; ValueError otherwise."""
    up = text.strip().upper()
    up = ALIASES.get(up, up)
    if up not in V2_NUMPY_NAME:
        raise ValueError(f"dtype {text!r} is not supported; use one of {', '.join(V2_NUMPY_NAME)}")
    return up


def _is_dtype(text: str) -> bool:
    up = text.strip().upper()
    return ALIASES.get(up, up) in V2_NUMPY_NAME


class InputSpec(NamedTuple):
    """A parsed input spec: name, KServe v2 datatype, shape (-1 = dynamic dimension)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def parse_input_spec(text: str) -> InputSpec:
    """Parse ``NAME[:DTYPE]:SHAPE`` (``input:FP32:3x224x224``, ``x:fp32:1,28,28``, ``x:-1x8``).

    DTYPE is a datatype or an alias (:data:`ALIASES`), FP32 when left out; names may contain ``:``
    (``input_1:0:FP32:8``). SHAPE items are separated by ``x``, ``,`` or ``*``, optionally in ``[]``/``()``;
    empty, ``[]`` or ``scalar`` is a scalar. Dimensions are > 0 or -1 (dynamic). ValueError otherwise.
    """
    raw = text.strip()
    if ":" not in raw:
        raise ValueError(f"input spec {text!r} is not NAME:DTYPE:SHAPE; {INPUT_SPEC_HINT}")
    parts = raw.rsplit(":", 2)
    if len(parts) == 3 and _is_dtype(parts[1]):
        name, dtype, shape_text = parts[0], normalize_dtype(parts[1]), parts[2]
    else:
        name, shape_text = raw.rsplit(":", 1)
        dtype = "FP32"
    name = name.strip()
    if not name:
        raise ValueError(f"input spec {text!r} has an empty name; {INPUT_SPEC_HINT}")
    s = shape_text.strip().strip("[]()").strip()
    if s.lower() in ("", "scalar"):
        return InputSpec(name, dtype, ())
    dims: list[int] = []
    for p in (p.strip() for p in re.split(r"[x,X*]", s)):
        if not _DIM_RE.fullmatch(p):
            raise ValueError(f"input spec {text!r}: shape item {p!r} is not a whole number; {INPUT_SPEC_HINT}")
        dims.append(int(p))
    if any(d == 0 or d < -1 for d in dims):
        raise ValueError(f"input spec {text!r}: every dimension must be > 0 (or -1: dynamic); {INPUT_SPEC_HINT}")
    return InputSpec(name, dtype, tuple(dims))

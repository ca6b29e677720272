"""What the ONNX and TorchScript inspectors share: the ``ModelInfo`` record, ``--input`` text to and from
``TensorSpec``, the names under which farm's TorchScript files declare their inputs, file hashing, and
the lazy import of onnx.

A module of its own so that ``farm.models.info`` (which dispatches to ``farm.models.torchscript``) and
``farm.models.torchscript`` both build on it without importing each other.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from farm.errors import RequestError
from schemas import TensorSpec
from schemas.dtypes import DTYPES, INPUT_SPEC_HINT, parse_input_spec
from schemas.input_data import split_value_range

#: Name of the JSON file (inside the TorchScript zip's ``extra/`` folder) and of the module attribute in
#: which farm's example TorchScript models carry their input spec: a list of ``name:DTYPE:shape`` strings.
FARM_INPUTS_ATTR = "farm_inputs"
FARM_INPUTS_EXTRA = "farm_inputs.json"
INPUT_HINT = "--input NAME:DTYPE:SHAPE (per-sample shape without batch, e.g. --input input:FP32:3x224x224)"


def onnx_modules() -> tuple[Any, Any, Any]:
    """``onnx``, ``onnx.helper`` and ``onnx.numpy_helper``, imported on first use: farm.models' one import of
    onnx, which the CLI (importing these modules at start) would otherwise pay on every command."""
    import onnx  # noqa: PLC0415 - onnx: +0.05-0.09 s on every CLI start, measured
    from onnx import helper, numpy_helper  # noqa: PLC0415 - as above

    return onnx, helper, numpy_helper


@dataclass
class ModelInfo:
    """What farm knows about a model file. Shapes are per sample (batch excluded); sizes in bytes.

    ``static_batch`` is the fixed batch size when the model's batch dimension is not dynamic.
    ``notes`` holds facts worth showing the user (e.g. output shapes that could not be inferred).
    """

    format: str
    sha256: str
    size_bytes: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    dynamic_batch: bool
    static_batch: int | None = None
    notes: list[str] = field(default_factory=list)
    context_tokens: int | None = None  # an LLM's context length (GGUF metadata, config.json), tokens

    def to_json(self) -> dict[str, Any]:
        """This record as JSON-ready data (it crosses the sandbox's pipe: ``farm.models.probe``)."""
        return {**{k: getattr(self, k) for k in ("format", "sha256", "size_bytes", "dynamic_batch",
                                                  "static_batch", "notes")},
                "inputs": [t.model_dump(mode="json") for t in self.inputs],
                "outputs": [t.model_dump(mode="json") for t in self.outputs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelInfo:
        """The record :meth:`to_json` wrote."""
        specs = {k: [TensorSpec.model_validate(t) for t in data[k]] for k in ("inputs", "outputs")}
        return cls(**{**data, **specs})


def one_line(text: object, limit: int = 300) -> str:
    """Collapse ``text`` to one line of at most ``limit`` characters (for error messages)."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


#: who reads a file to hash it while ``hashing_by`` holds (a submit: ``farm.artifacts.Intake``, which stores the
#: bytes as it hashes them, so the model is read once); None: ``read_sha256``
_HASHER: ContextVar[Callable[[Path], str] | None] = ContextVar("farm_hasher", default=None)


@contextmanager
def hashing_by(hasher: Callable[[Path], str]) -> Iterator[None]:
    """For the block, ``sha256_file`` asks ``hasher`` for a file's sha256 (it reads the file once, for its own
    purpose as well: a submit stores the bytes it hashes)."""
    token = _HASHER.set(hasher)
    try:
        yield
    finally:
        _HASHER.reset(token)


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in ``chunk_bytes`` chunks (constant memory); by the hasher ``hashing_by``
    set, if any (the model inspected by a submit)."""
    hasher = _HASHER.get()
    return hasher(path) if hasher is not None else read_sha256(path, chunk_bytes)


def read_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, read here in ``chunk_bytes`` chunks (constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- parsing
def tensor_spec(text: str) -> TensorSpec:
    """The TensorSpec of an ``--input`` text (grammar: ``schemas.dtypes.parse_input_spec``), e.g.
    ``input:FP32:3x224x224``, or ``ids:INT64:128:0..30521`` (random values in 0..30521): the shape is per
    sample, so every dimension is > 0. RequestError otherwise."""
    try:
        rest, value_range = split_value_range(text)
        name, dtype, shape = parse_input_spec(rest)
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    if dtype not in DTYPES:
        raise RequestError(f"input spec {text!r}: dtype {dtype} is not supported; use one of {', '.join(DTYPES)}")
    if any(d <= 0 for d in shape):
        raise RequestError(
            f"input spec {text!r}: every dimension must be > 0 and the batch dimension is left out; {INPUT_SPEC_HINT}"
        )
    try:
        return TensorSpec(name=name, dtype=dtype, shape=shape, value_range=value_range)
    except ValidationError as exc:  # the value range does not fit the dtype
        raise RequestError(f"input spec {text!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def format_input_spec(spec: TensorSpec) -> str:
    """The CLI form of a spec: ``name:DTYPE:3x224x224`` (inverse of ``tensor_spec``)."""
    text = f"{spec.name}:{spec.dtype}:{'x'.join(str(d) for d in spec.shape)}"
    return text if spec.value_range is None else f"{text}:{spec.value_range[0]:g}..{spec.value_range[1]:g}"



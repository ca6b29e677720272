"""Which data the load generator sends: random values (within each input's value range), zeros, or the
rows of a user's file, carried in the job's spec so that any worker can rebuild the same tensors."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: largest file (bytes of raw array data) carried in a job's spec; rows are cycled, so a few suffice
MAX_FILE_BYTES = 1 << 20
_RANGE_RE = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*\.\.\s*([+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*$")


class DataArray(BaseModel):
    """One input's rows from a file: KServe v2 datatype, shape (rows first), raw little-endian bytes
    in base64."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str
    shape: tuple[int, ...]
    b64: str


class InputData(BaseModel):
    """``random`` (default: uniform values, within each input's ``value_range`` when given), ``zeros``,
    or ``file`` (``source``: the file's path as given, then its name; ``sha256``; ``arrays``: one per
    input, filled in at submission once checked against the model, rows cycled to fill each batch)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["random", "zeros", "file"] = "random"
    source: str | None = Field(default=None, max_length=4096)
    sha256: str | None = None
    arrays: dict[str, DataArray] | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, v: object) -> object:
        """``random``, ``zeros`` or a file path (resolved against the model's inputs at submission)."""
        if isinstance(v, str):
            kind = v.strip().lower()
            return {"kind": kind} if kind in ("random", "zeros") else {"kind": "file", "source": v.strip()}
        return v

    @model_validator(mode="after")
    def _check(self) -> InputData:
        if self.kind == "file" and not self.source:
            raise ValueError("input data of kind 'file' needs the file's path (source)")
        if self.kind != "file" and self.arrays is not None:
            raise ValueError(f"input data of kind {self.kind!r} carries no arrays")
        return self

    def describe(self) -> dict[str, object]:
        """What a result records of the data: kind, and the file's name and sha256 for ``file``."""
        out: dict[str, object] = {"kind": self.kind}
        if self.kind == "file":
            out.update(source=self.source, sha256=self.sha256,
                       rows={n: a.shape[0] if a.shape else 1 for n, a in (self.arrays or {}).items()})
        return out


def split_value_range(text: str) -> tuple[str, tuple[float, float] | None]:
    """Split a trailing ``:LOW..HIGH`` off an ``--input`` text (``ids:INT64:128:0..30521``): the rest
    and (low, high), or the text unchanged and None. ValueError when LOW > HIGH."""
    head, sep, tail = text.rpartition(":")
    m = _RANGE_RE.match(tail) if sep else None
    if m is None:
        return text, None
    low, high = float(m.group(1)), float(m.group(2))
    if low > high:
        raise ValueError(f"input spec {text!r}: value range {tail.strip()} has LOW > HIGH; use LOW..HIGH")
    return head, (low, high)

"""The parts of a profiling request: one model input (:class:`TensorSpec`) and a constrained edge box
(:class:`EdgeProfile`), with the memory-size parser they share."""
from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.cpus import parse_cpu_list
from schemas.dtypes import DTYPES

_MEMORY_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgKMG]?)(?:i?[bB])?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,199}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$")
#: the most elements one sample of an input may have (2**31: what protobuf and most engines can hold in one
#: tensor); the bytes of a batch are bounded again at submit by FARM_MAX_INPUT_BYTES
MAX_INPUT_ELEMENTS = 1 << 31


def parse_memory(value: str | int) -> int:
    """Parse a memory size such as ``512m``, ``1g``, ``1.5GiB`` or bytes into bytes (binary units)."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"memory must be positive, got {value}")
        return value
    m = _MEMORY_RE.match(str(value).strip())
    if not m:
        raise ValueError(f"memory {value!r} is not a size; use e.g. 512m, 1g or a number of bytes")
    number, unit = float(m.group(1)), m.group(2).lower()
    size = int(number * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit])
    if size < (4 << 20):
        raise ValueError(f"memory {value!r} is below 4 MiB, which no container can start in")
    return size


class StrictModel(BaseModel):
    """A request part: unknown fields refused, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(StrictModel):
    """One model input: name, dtype (KServe v2 datatype) and shape without the batch dimension."""

    name: str = Field(min_length=1, max_length=256)
    dtype: str = "FP32"
    shape: tuple[int, ...] = Field(description="per-sample shape, batch dimension excluded; all dims > 0")

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        up = v.upper()
        if up not in DTYPES:
            raise ValueError(f"dtype {v!r} is not supported; allowed: {', '.join(DTYPES)}")
        return up

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in v):
            raise ValueError(f"shape {list(v)} has a dimension <= 0; give concrete sizes (batch excluded)")
        if math.prod(v) > MAX_INPUT_ELEMENTS:
            raise ValueError(f"shape {list(v)} has {math.prod(v):.3g} elements per sample, above "
                             f"{MAX_INPUT_ELEMENTS:,}")
        return v

    value_range: tuple[float, float] | None = Field(
        default=None, description="random values in [low, high] (integers: both ends included); "
                                  "--input ids:INT64:128:0..30521")

    @model_validator(mode="after")
    def _range(self) -> TensorSpec:
        r = self.value_range
        if r is not None:
            if r[0] > r[1]:
                raise ValueError(f"input {self.name!r}: value range {r[0]:g}..{r[1]:g} has low > high")
            if not self.dtype.startswith(("FP", "BOOL")) and any(v != int(v) for v in r):
                raise ValueError(f"input {self.name!r} is {self.dtype}: its value range needs whole numbers")
        return self


class EdgeProfile(StrictModel):
    """A constrained edge box: CPU share (cores), memory limit (bytes) and optional cpuset (``0-1``)."""

    name: str = ""
    cpus: float = Field(gt=0, le=256, description="CPU limit in cores, e.g. 0.5")
    memory: int = Field(description="memory limit in bytes; accepts 512m, 1g")
    cpuset: str | None = None
    image: str | None = Field(default=None, max_length=255,
                              description="run `command` in this local image instead of farm's runtime image")
    command: list[str] | None = Field(default=None, description="argv run instead of farm's edge benchmark; "
                                      "{model} is replaced by the model's path inside the container")

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not _IMAGE_RE.match(v):
            raise ValueError(f"image {v!r} is not an image reference like name:tag or registry/name@sha256:...")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or any(not a or "\x00" in a for a in v)):
            raise ValueError("command must be a non-empty list of non-empty arguments (argv, no shell)")
        return v

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, v: object) -> int:
        if isinstance(v, (str, int)) and not isinstance(v, bool):
            return parse_memory(v)
        raise ValueError(f"memory must be a size like 512m or 1g, got {v!r}")

    @field_validator("cpuset")
    @classmethod
    def _cpuset(cls, v: str | None) -> str | None:
        if v is not None:
            parse_cpu_list(v)  # ValueError says what a CPU list looks like
        return v

    @property
    def cores(self) -> list[int]:
        """The cores of the cpuset (empty: none given)."""
        return parse_cpu_list(self.cpuset) if self.cpuset else []

    @model_validator(mode="after")
    def _default_name(self) -> EdgeProfile:
        if not self.name:
            object.__setattr__(self, "name", f"cpus{self.cpus:g}-mem{self.memory >> 20}m")
        if self.image is not None and self.command is None:
            raise ValueError("an edge profile with an image needs a command to run in it")
        if not _NAME_RE.match(self.name):
            raise ValueError(
                f"edge profile name {self.name!r} must be 1-63 characters of letters, digits, '_', '.', '-'"
            )
        return self

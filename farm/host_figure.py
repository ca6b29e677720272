"""A model's speed in a host's own units, so two machines can be lined up (``farm compare --interleaved REF MODEL
--host-figure FILE``, then ``farm compare --hosts X.json Y.json``).

On one host, MODEL is measured interleaved against a reference model REF (``workers.interleave``: the same cores,
blocks alternating), so each pair's cost ratio MODEL / REF is the model's cost in units of the reference's, the
host's speed cancelled as the host's drift cancels in an A/B compare. The figure file keeps every pair's ratio,
what both models are (name, sha256), the cell, and the host (CPU model, cores, kernel). On another host the same
command gives another file; lined up (``farm.verdict.line_up``), the two say whether the model costs more of the
reference on one host than on the other: what a faster or slower machine does to every model alike cancels.

Its limits (docs/trust.md): it cancels a speed common to both models (clock, a busier neighbour, a slower VM),
not a difference in kind. A model bound by memory bandwidth and a reference bound by compute scale apart across
cache sizes, memory channels and instruction sets (AVX-512, AMX); so do different thread counts. The nearer the
reference is to the model (engine, threads, batch, the same kind of layers), the more the figure means; it never
turns into inferences/s on the other host.
"""
from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from farm.errors import RequestError

#: the figure file's format
VERSION = 1


class ModelId(BaseModel):
    """A model as the figure names it: its file name and sha256."""

    name: str
    sha256: str


class HostFigure(BaseModel):
    """One host's figure: ``ratios`` (per pair, MODEL's cost over REF's), their median (``figure``), what was
    measured and where."""

    version: int = VERSION
    model: ModelId
    reference: ModelId
    cell: str
    metric: str
    ratios: list[float] = Field(min_length=1)
    figure: float
    host: dict[str, str | int]
    measured_at: str


def make(model: ModelId, reference: ModelId, cell: str, metric: str, ratios: list[float],
         host: dict[str, str | int]) -> HostFigure:
    """The figure of ``ratios`` measured on the host ``host`` describes (CPU model, cores, ...; the caller's, which
    knows the hardware), with this kernel and node."""
    facts: dict[str, str | int] = {**host, "kernel": platform.release(), "node": platform.node()}
    return HostFigure(model=model, reference=reference, cell=cell, metric=metric, ratios=ratios,
                      figure=float(np.median(ratios)), host=facts,
                      measured_at=datetime.now(UTC).isoformat(timespec="seconds"))


def write(fig: HostFigure, path: Path) -> None:
    """Write ``fig`` to ``path`` whole (a temporary file renamed: never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(fig.model_dump_json(indent=2))
    os.replace(tmp, path)


def read(path: Path) -> HostFigure:
    """The figure at ``path``; RequestError (one line) when it is missing or not a figure file."""
    try:
        return HostFigure.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise RequestError(f"{path}: cannot read it ({exc.strerror}); give a file written by farm compare "
                           "--interleaved REF MODEL --host-figure FILE") from None
    except (ValidationError, json.JSONDecodeError):
        raise RequestError(f"{path} is not a host figure (farm compare --interleaved REF MODEL --host-figure "
                           "FILE writes one)") from None


def comparable(x: HostFigure, y: HostFigure) -> None:
    """RequestError (one line) unless both figures are of one model against one reference on one cell."""
    for what, a, b in (("model", x.model.sha256, y.model.sha256), ("reference", x.reference.sha256,
                                                                   y.reference.sha256),
                       ("cell", x.cell, y.cell), ("figure", x.metric, y.metric)):
        if a != b:
            raise RequestError(f"the two host figures differ in their {what} ({str(a)[:24]} against {str(b)[:24]}): "
                               "line up figures of the same model, reference and cell")

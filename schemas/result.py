"""The outcome of one job: metric values keyed by the metric registry's names."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class JobResult(BaseModel):
    """One job's measured result.

    ``metrics`` maps metric names (see ``farm.metrics``) to values in the registry's units; a metric that
    was not measured is absent (reported as null), never 0. ``details`` holds the rest: latency histogram,
    per-window series, error counts by gRPC status, sampler series, notes on unenforced limits.
    """

    job_id: str
    metrics: dict[str, float | int | bool | None] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)

"""The outcome of one job: metric values keyed by the metric registry's names."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from schemas.metrics import JOB_METRICS

_JOB_METRIC_NAMES = frozenset(m.name for m in JOB_METRICS)


class JobResult(BaseModel):
    """One job's measured result.

    ``metrics`` maps job metric names (see ``schemas.metrics``) to values in the registry's units; a metric
    that was not measured is absent (reported as null), never 0. An unregistered name fails validation
    here, when the result is built. ``details`` holds the rest: latency histogram, per-window series,
    error counts by gRPC status, sampler series, notes on unenforced limits.
    """

    job_id: str
    metrics: dict[str, float | int | bool | None] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)

    @field_validator("metrics")
    @classmethod
    def _registered(cls, v: dict[str, float | int | bool | None]) -> dict[str, float | int | bool | None]:
        unknown = sorted(set(v) - _JOB_METRIC_NAMES)
        if unknown:
            raise ValueError(
                f"metric(s) {', '.join(unknown)} are not job metrics of schemas.metrics; "
                f"register them there or use one of: {', '.join(sorted(_JOB_METRIC_NAMES))}"
            )
        return v

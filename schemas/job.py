"""A job: one cell of the expanded matrix, as the scheduler writes it and a worker runs it."""
from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.input_data import InputData
from schemas.llm_engines import KnobValue, check_knobs
from schemas.request import MeasurementSettings
from schemas.specs import EdgeProfile, TensorSpec


class JobStatus(StrEnum):
    """Job life cycle: queued -> claimed -> running -> succeeded | failed | cancelled.

    A claimed or running job may also go back to queued (released by its worker, or requeued by
    reconciliation). Members compare equal to their strings, so SQL and JSON carry the plain names."""

    queued = "queued"
    claimed = "claimed"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def final(self) -> bool:
        return self in FINAL


#: states in which a worker holds the job
ACTIVE: frozenset[JobStatus] = frozenset({JobStatus.claimed, JobStatus.running})
#: states a job never leaves
FINAL: frozenset[JobStatus] = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})


class JobSpec(BaseModel):
    """Everything a worker needs to run one measurement, independent of the database."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    request_id: str
    model_sha256: str
    model_format: str
    model_filename: str = "model"
    inputs: list[TensorSpec]
    device: str  # "cpu" or "gpu:<slug>"
    engine: str
    batch_size: int
    concurrency: int
    edge_profile: EdgeProfile | None = None
    queue: str
    measurement: MeasurementSettings
    input_data: InputData | None = None  # None: random
    repeat: int = Field(default=0, ge=0)  # which run of its cell (0-based; ``ProfileRequest.repeats``)
    # an LLM engine's settings (``schemas.llm_engines.KNOBS``: name -> value), checked for its engine
    knobs: dict[str, KnobValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _knobs(self) -> JobSpec:
        check_knobs(self.engine, self.knobs)  # ValueError: a knob the engine does not have, or a bad value
        return self

    @property
    def is_edge(self) -> bool:
        return self.edge_profile is not None

    @property
    def rate(self) -> float | None:
        """The job's open-loop rate, requests/s (None in closed loop): its load with ``concurrency``, held by
        its ``measurement`` (what the load generator reads) and stored in the ``jobs.rate`` column."""
        return self.measurement.rate if self.measurement.mode != "closed" else None

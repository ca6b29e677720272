"""A job: one cell of the expanded matrix, as the scheduler writes it and a worker runs it."""
from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, computed_field, model_validator

from schemas.engines import Protocol, is_openai
from schemas.input_data import InputData
from schemas.knobs import KnobValue
from schemas.llm_engines import check_knobs
from schemas.load_levels import ClosedLoop, LoadLevel, OpenLevel, load_level
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


_LEVEL: TypeAdapter[ClosedLoop | OpenLevel] = TypeAdapter(LoadLevel)


def _mode_rate(m: Any, concurrency: int) -> tuple[str, int, float | None]:
    """(mode, concurrency, rate) of an older job: its ``measurement``'s (a model or its dict) mode and rate."""
    if isinstance(m, MeasurementSettings):
        return m.mode, concurrency, m.rate
    return m.get("mode", "closed"), concurrency, m.get("rate")


def protocol_of(engine: str, llm: object | None) -> Protocol:
    """The protocol a job on ``engine`` speaks (its card's; an endpoint's: OpenAI where its measurement's ``llm``
    settings ``llm`` are set, else KServe v2): what the expansion sets as :attr:`JobSpec.protocol`."""
    return "openai" if is_openai(engine, llm) else "kserve"


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
    # how the load side talks to the job's server, set at expansion from the engine's card (``protocol_of``): the
    # one answer to "is this an LLM job?". Absent (an older stored job, a job built without it) it is derived from
    # the card before validation (:meth:`_protocol_from_card`), so the default below is never the one taken
    protocol: Protocol = "kserve"
    batch_size: int
    load: LoadLevel  # the load level, the one place: concurrency, mode and rate
    edge_profile: EdgeProfile | None = None
    queue: str
    measurement: MeasurementSettings  # its ``mode`` and ``rate`` mirror ``load`` (:meth:`_load_in_one_place`)
    input_data: InputData | None = None  # None: random
    repeat: int = Field(default=0, ge=0)  # which run of its cell (0-based; ``ProfileRequest.repeats``)
    # an LLM engine's settings (``schemas.llm_engines.KNOBS``: name -> value), checked for its engine
    knobs: dict[str, KnobValue] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _load_in_one_place(cls, data: Any) -> Any:
        """``load`` from an older job's ``concurrency`` and ``measurement.mode``/``rate`` (jobs serialized before
        ``load`` existed still load); where both are given (a dump: :attr:`concurrency` is in it), they must
        agree; ``measurement.mode``/``rate`` then set from ``load``, so the stored measurement (read by the results
        view) never disagrees with it."""
        if not isinstance(data, dict) or data.get("measurement") is None:
            return data
        data = dict(data)
        concurrency, m = data.pop("concurrency", None), data["measurement"]
        if concurrency is not None:
            old = load_level(*_mode_rate(m, concurrency))
            given = _LEVEL.validate_python(data.setdefault("load", old))
            if given != old:
                raise ValueError(f"the job's load ({given!r}) disagrees with its concurrency and measurement mode/rate "
                                 f"({old!r})")
        if data.get("load") is not None:
            level = _LEVEL.validate_python(data["load"])
            data["load"] = level
            if isinstance(m, MeasurementSettings):
                changed = (m.mode, m.rate) != (level.type, level.rate)
                data["measurement"] = m.model_copy(update={"mode": level.type, "rate": level.rate}) if changed else m
            elif isinstance(m, dict):
                data["measurement"] = {**m, "mode": level.type, "rate": level.rate}
        return data

    @model_validator(mode="before")
    @classmethod
    def _protocol_from_card(cls, data: Any) -> Any:
        """``protocol`` of a job stored before it existed (or built without it): from its engine's card and its
        measurement's ``llm`` settings (``protocol_of``)."""
        if not isinstance(data, dict) or data.get("protocol") is not None or "engine" not in data:
            return data
        m = data.get("measurement")
        llm = m.llm if isinstance(m, MeasurementSettings) else (m or {}).get("llm") if isinstance(m, dict) else None
        return {**data, "protocol": protocol_of(str(data["engine"]), llm)}

    @property
    def speaks_openai(self) -> bool:
        """Whether the job is an LLM one, driven over the OpenAI API (:attr:`protocol`)."""
        return self.protocol == "openai"

    @model_validator(mode="after")
    def _knobs(self) -> JobSpec:
        check_knobs(self.engine, self.knobs)  # ValueError: a knob the engine does not have, or a bad value
        return self

    @property
    def is_edge(self) -> bool:
        return self.edge_profile is not None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def concurrency(self) -> int:
        """The job's concurrency, from ``load`` (an open loop's: the one it was listed under), stored in the
        ``jobs.concurrency`` column and kept in its dump."""
        return self.load.concurrency

    @property
    def rate(self) -> float | None:
        """The job's open-loop rate, requests/s (None in closed loop), from ``load``; stored in the ``jobs.rate``
        column."""
        return self.load.rate

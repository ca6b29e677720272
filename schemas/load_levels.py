"""A job's load level as one typed value (:data:`LoadLevel`): how requests are offered to the server, with its
parameters. A tagged union keyed by ``type``: a closed loop keeps ``concurrency`` requests outstanding; an open
loop sends ``rate`` requests/s, evenly spaced (constant) or with exponential gaps (Poisson), or replays a request
trace on its own schedule (``trace``: its mean rate recorded, the schedule read from the trace file).

The request keeps its user-facing split (``--concurrency``, ``--mode``, ``--rate``); the expansion builds one
level per job (:func:`load_level`). Each load client translates the level into its own terms (farm's generator's
send schedule, perf_analyzer's options). Sessions (``measurement.llm.sessions``) are no kind of their own: a
sessions workload counts sessions at the same levels (``concurrency`` sessions in flight, or ``rate`` sessions/s,
constant or Poisson), so each fact keeps one place: how sessions arrive here, what each one sends in the workload.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Level(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClosedLoop(_Level):
    """``concurrency`` requests always outstanding, each sent again as soon as it is answered."""

    type: Literal["closed"] = "closed"
    concurrency: int = Field(ge=1)

    @property
    def rate(self) -> None:
        """A closed loop has no offered rate."""
        return None


class _OpenLoop(_Level):
    """``rate`` requests/s, answered or not. ``concurrency``: the request's concurrency the step was listed under,
    recorded with the job (the ``jobs.concurrency`` column, its id); an open loop's sends do not depend on it."""

    rate: float = Field(gt=0)
    concurrency: int = Field(default=1, ge=1)


class ConstantRate(_OpenLoop):
    """``rate`` requests/s evenly spaced."""

    type: Literal["constant"] = "constant"


class PoissonRate(_OpenLoop):
    """``rate`` requests/s on average with exponential gaps (a Poisson process)."""

    type: Literal["poisson"] = "poisson"


class TraceReplay(_OpenLoop):
    """A request trace replayed on its own schedule (``measurement.llm.trace``); ``rate``: its mean rate (requests/s)
    at its ``trace_speed``, as the request recorded it at submit."""

    type: Literal["trace"] = "trace"


#: a job's load level, one of the kinds above by its ``type``
LoadLevel = Annotated[ClosedLoop | ConstantRate | PoissonRate | TraceReplay, Field(discriminator="type")]
#: the open-loop kinds by ``type`` (the request's ``measurement.mode``)
OPEN_LEVELS: dict[str, type[ConstantRate] | type[PoissonRate] | type[TraceReplay]] = {
    "constant": ConstantRate, "poisson": PoissonRate, "trace": TraceReplay}
OpenLevel = ConstantRate | PoissonRate | TraceReplay


def load_level(mode: str, concurrency: int, rate: float | None) -> ClosedLoop | OpenLevel:
    """The level of a request's ``measurement.mode`` at ``concurrency`` and ``rate`` (requests/s, open loop);
    ValueError for an open loop without a rate or an unknown mode."""
    if mode == "closed":
        return ClosedLoop(concurrency=concurrency)
    if mode not in OPEN_LEVELS:
        raise ValueError(f"unknown load mode {mode!r}")
    if rate is None:
        raise ValueError(f"an open loop ({mode}) needs a rate")
    return OPEN_LEVELS[mode](rate=rate, concurrency=concurrency)

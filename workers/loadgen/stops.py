"""Stop rules: when a run ends before (or at) its plan's end, as small objects a load loop asks as it runs,
instead of branches in it. Each rule says whether it stops the run (:meth:`StopRule.should_stop`, with why),
when it is judged (as each request ends, or on the loop's in-flight sampler's ticks) and the latest time it
lets the run go on (``limit_s``). The OpenAI client's over-saturation rule lives with it
(``openai.saturation.OverSaturation``); farm's gRPC client judges its rules (``NoSuccess``, ``Stable``,
``Duration``) as each measurement window merges. Times in s, measured from the schedule's start unless said
otherwise."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from schemas import MeasurementSettings
from workers.loadgen.contract import WindowFigures
from workers.loadgen.result import judge_stable


@dataclass(frozen=True, slots=True)
class Progress:
    """A run as a rule judges it: ``now`` and its schedule's start ``t_start`` (monotonic s), its warm-up
    (``warmup_s``), the measured requests completed, and the sampled series: requests in flight and each
    request's time to its first chunk (``(monotonic s, value)`` pairs; empty where the loop does not sample),
    the merged measurement ``windows`` (empty where the loop has none) and the requests that ``succeeded`` so far,
    warm-up included (None where the loop does not count them)."""

    now: float
    t_start: float
    warmup_s: float
    measured_done: int
    in_flight: Sequence[tuple[float, float]] = ()
    first_ms: Sequence[tuple[float, float]] = ()
    windows: Sequence[WindowFigures] = ()
    succeeded: int | None = None

    @property
    def elapsed_s(self) -> float:
        """Time since the schedule's start, s."""
        return self.now - self.t_start


class StopRule(Protocol):
    """When a run stops. ``sampled``: judged on the sampler's ticks (the loop then samples its in-flight count),
    else as each request ends; ``ends_span``: a stop by it is the run's verdict, recorded with its time (the
    measured span ends there); ``limit_s``: the latest time (s after the schedule's start) the rule lets the run go
    on, None: no time limit."""

    sampled: ClassVar[bool]
    ends_span: ClassVar[bool]

    @property
    def limit_s(self) -> float | None: ...

    def should_stop(self, progress: Progress) -> str | None:
        """Why the run stops now, None to go on."""


class Judged:
    """A rule's defaults: judged as each request ends, not the run's verdict, no time limit."""

    __slots__ = ()
    sampled: ClassVar[bool] = False
    ends_span: ClassVar[bool] = False

    @property
    def limit_s(self) -> float | None:
        return None


@dataclass(frozen=True, slots=True)
class RequestCount(Judged):
    """Stop once ``n`` measured requests completed."""

    n: int

    def should_stop(self, progress: Progress) -> str | None:
        return f"{self.n} measured requests completed" if progress.measured_done >= self.n else None


@dataclass(frozen=True, slots=True)
class Duration(Judged):
    """Stop ``seconds`` after the schedule's start (a plan's warm-up and windows, or a job's time limit)."""

    seconds: float

    @property
    def limit_s(self) -> float | None:
        return self.seconds

    def should_stop(self, progress: Progress) -> str | None:
        return f"{self.seconds:g} s ran" if progress.elapsed_s >= self.seconds else None


@dataclass(frozen=True, slots=True)
class NoSuccess(Judged):
    """Stop once a measurement window has merged and no request has succeeded yet, warm-up included (the run
    cannot measure anything; its errors say why)."""

    def should_stop(self, progress: Progress) -> str | None:
        if progress.windows and progress.succeeded == 0:
            return "no request succeeded"
        return None


@dataclass(frozen=True, slots=True)
class Stable(Judged):
    """Stop once the merged windows meet the job's stability rule (``result.judge_stable``: the last
    ``min_windows`` agree within ``stability_pct``)."""

    settings: MeasurementSettings

    def should_stop(self, progress: Progress) -> str | None:
        if progress.windows and judge_stable(progress.windows, self.settings):
            return f"stable over the last {self.settings.min_windows} windows"
        return None


def end_s(rules: Sequence[StopRule], default_s: float) -> float:
    """When the run ends at the latest (s after the schedule's start): its rules' earliest limit, else
    ``default_s``."""
    return min((r.limit_s for r in rules if r.limit_s is not None), default=default_s)

"""Load patterns: how farm's generators (kserve and OpenAI) issue requests, as strategy objects. A closed loop keeps
``concurrency`` requests outstanding; an open loop sends ``rate`` requests/s on a schedule, evenly spaced
(constant), with exponential gaps (Poisson) or on a request trace's own schedule, and counts latency from each
request's scheduled time.

Each pattern says how it splits over client processes, the send schedule farm's generator follows, and whether
its sends can be late: farm's generators' terms for a job's load level (``schemas.load_levels``, :func:`pattern_of`;
perf_analyzer's are ``perf_analyzer.tool.load_args``). A new pattern is one class here and one entry in
``OPEN_PATTERNS``.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

from schemas import load_levels as levels


class Traffic(Protocol):
    """What starts a pattern's traffic in farm's generator (its worker)."""

    def closed_loop(self, slots: int) -> None:
        """Keep ``slots`` requests outstanding, each sent again as soon as it is answered."""

    def open_loop(self, send_times: Iterator[float]) -> None:
        """Send one request at each of ``send_times`` (monotonic s), answered or not."""


class LoadPattern(ABC):
    """How requests are issued. ``mode``: the name a job's settings use (and its details record)."""

    mode: ClassVar[str]

    @property
    def rate(self) -> float | None:
        """Requests/s of an open loop; None for a closed loop."""
        return None

    @abstractmethod
    def split(self, processes: int) -> list[LoadPattern]:
        """The pattern each of at most ``processes`` client processes runs so that together they run this one."""

    @abstractmethod
    def start(self, traffic: Traffic, t_start: float, seed: int) -> None:
        """Start farm's generator's traffic for this pattern, its schedule beginning at ``t_start``."""

    def late_pct(self, sent: int, late: int) -> float | None:
        """The share (%) of sends that left late; None where sends have no schedule (closed loop)."""
        return None

    def max_processes(self, cap: int) -> int:
        """The most client processes this pattern can use, at most ``cap``."""
        return cap

    def outstanding(self, processes: int) -> int | None:
        """Requests each of ``processes`` client processes keeps outstanding; None in open loop (no fixed count)."""
        return None


@dataclass(frozen=True, slots=True)
class ClosedLoop(LoadPattern):
    """``concurrency`` requests always outstanding."""

    mode: ClassVar[str] = "closed"
    concurrency: int

    def split(self, processes: int) -> list[LoadPattern]:
        """The outstanding requests as evenly as possible (never more processes than requests)."""
        c = self.concurrency
        n = max(1, min(processes, c))
        return [ClosedLoop(c // n + (1 if i < c % n else 0)) for i in range(n)]

    def start(self, traffic: Traffic, t_start: float, seed: int) -> None:
        traffic.closed_loop(self.concurrency)

    def max_processes(self, cap: int) -> int:
        return min(cap, self.concurrency)

    def outstanding(self, processes: int) -> int | None:
        return max(1, self.concurrency // processes)


@dataclass(frozen=True, slots=True)
class ConstantRate(LoadPattern):
    """``rate`` requests/s evenly spaced, the first ``phase_s`` after the schedule starts."""

    mode: ClassVar[str] = "constant"
    rate_per_s: float
    phase_s: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.rate_per_s

    def split(self, processes: int) -> list[LoadPattern]:
        """The rate split evenly; constant schedules interleaved, so the sum is still evenly spaced."""
        n = max(1, processes)
        return [replace(self, rate_per_s=self.rate_per_s / n, phase_s=i / self.rate_per_s) for i in range(n)]

    def start(self, traffic: Traffic, t_start: float, seed: int) -> None:
        traffic.open_loop(self.send_times(t_start, seed))

    def send_times(self, t_start: float, seed: int) -> Iterator[float]:
        """The scheduled send times (monotonic s) from ``t_start``."""
        interval = 1.0 / self.rate_per_s
        t = t_start + self.phase_s
        while True:
            yield t
            t += interval

    def late_pct(self, sent: int, late: int) -> float | None:
        return 100.0 * late / sent if sent else 0.0


@dataclass(frozen=True, slots=True)
class PoissonRate(ConstantRate):
    """``rate`` requests/s on average with exponential gaps (a Poisson process; ``phase_s`` unused)."""

    mode: ClassVar[str] = "poisson"

    def send_times(self, t_start: float, seed: int) -> Iterator[float]:
        rng = random.Random(seed)
        t = t_start
        while True:
            t += rng.expovariate(self.rate_per_s)
            yield t


@dataclass(frozen=True, slots=True)
class TraceReplay(ConstantRate):
    """A request trace's own schedule: one send at each of ``offsets_s`` (s from the start), then none; ``rate``: its
    mean rate (recorded). The offsets come from the trace file the job's workload reads (the OpenAI client's
    :meth:`with_offsets`); one process sends them all, in the trace's order (its prompts' order)."""

    mode: ClassVar[str] = "trace"
    offsets_s: tuple[float, ...] = ()

    def with_offsets(self, offsets_s: tuple[float, ...]) -> TraceReplay:
        return replace(self, offsets_s=offsets_s)

    def split(self, processes: int) -> list[LoadPattern]:
        return [self]

    def max_processes(self, cap: int) -> int:
        return 1

    def send_times(self, t_start: float, seed: int) -> Iterator[float]:
        if not self.offsets_s:
            raise ValueError("a trace replay was started without its schedule (TraceReplay.with_offsets)")
        return (t_start + o for o in self.offsets_s)


OPEN_PATTERNS: dict[str, type[ConstantRate]] = {p.mode: p for p in (ConstantRate, PoissonRate, TraceReplay)}


def pattern_of(level: levels.ClosedLoop | levels.OpenLevel) -> LoadPattern:
    """The pattern of a job's load ``level``: a closed loop at its concurrency, else an open loop at its rate."""
    if isinstance(level, levels.ClosedLoop):
        return ClosedLoop(level.concurrency)
    return OPEN_PATTERNS[level.type](level.rate)

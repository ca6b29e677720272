"""The window plan of a measurement, built once from its settings for every client (and the edge bench):
a warm-up, then measurement windows; which of them the metrics use; when a run may stop early."""
from __future__ import annotations

from dataclasses import dataclass

from schemas import MeasurementSettings


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """``warmup_s`` then one window per ``lengths_s`` (s, in order). ``until_stable``: the run may stop as
    soon as its last ``min_windows`` agree (no ``duration_s``), and its metrics then use those last
    ``min_windows``; otherwise every window counts."""

    warmup_s: float
    lengths_s: tuple[float, ...]
    min_windows: int
    until_stable: bool

    @classmethod
    def of(cls, settings: MeasurementSettings, *, extendable: bool = True) -> WindowPlan:
        """The plan of ``settings``: ``duration_s`` cut into ``window_s`` pieces (the last one shorter when
        it does not divide), else ``max_windows`` of ``window_s`` stopping once stable, or, for a client that
        cannot stop early (``extendable`` False), a fixed ``min_windows`` of ``window_s``."""
        if settings.duration_s is not None:
            return cls(settings.warmup_s, _cut(settings.duration_s, settings.window_s), settings.min_windows, False)
        n = settings.max_windows if extendable else settings.min_windows
        return cls(settings.warmup_s, (settings.window_s,) * n, settings.min_windows, extendable)

    @property
    def measured_s(self) -> float:
        """The windows' total length (s), warm-up excluded."""
        return sum(self.lengths_s)

    @property
    def span_s(self) -> float:
        """Warm-up and windows together (s)."""
        return self.warmup_s + self.measured_s

    def edges_s(self) -> tuple[float, ...]:
        """Where the warm-up and each window end, in s from the start."""
        out, t = [], self.warmup_s
        out.append(t)
        for length in self.lengths_s:
            t += length
            out.append(t)
        return tuple(out)

    def metric_windows(self, done: int) -> slice:
        """Which of ``done`` completed windows the metrics use: all of a fixed plan, the last
        ``min_windows`` of one run until stable."""
        return slice(max(0, done - self.min_windows) if self.until_stable else 0, done)


def _cut(duration_s: float, window_s: float) -> tuple[float, ...]:
    full = int(duration_s // window_s)
    rest = duration_s - full * window_s
    lengths: list[float] = [window_s] * full
    if rest > 1e-6 * window_s or not lengths:
        lengths.append(rest if lengths else duration_s)
    return tuple(lengths)


def fixed_measured_s(settings: MeasurementSettings) -> float:
    """The measured time (s) of a client that cannot stop early: ``duration_s``, else ``min_windows`` windows."""
    return WindowPlan.of(settings, extendable=False).measured_s


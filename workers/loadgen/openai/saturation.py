"""Over-saturation: an open-loop step whose server takes requests more slowly than they arrive. Its queue
grows without bound, so measuring the rest of the step only waits for a verdict already known (GuideLLM's
over-saturation stop, the same idea: a steadily growing count of requests in flight with a climbing TTFT).

Pure functions over samples (``(t_s, value)`` pairs, monotonic s), no I/O: ``openai_http`` samples the
requests in flight and each request's time to its first chunk, and asks :func:`verdict` as the step runs.

The rule, over the last ``window_s`` seconds: the least-squares slope of the in-flight count is positive, at
least ``Z`` standard errors above zero, at least ``RATE_FRAC`` of the arrival rate (requests arrive a fifth
faster than they finish), and adds ``MIN_GROWTH`` requests (and ``GROWTH_FRAC`` of the mean count) over the
window; and the TTFT slope is positive and ``Z`` standard errors above zero. All must hold:
a burst of Poisson arrivals raises the in-flight count for a moment, and a slow prompt raises one TTFT, but
only a server behind its arrivals has both climbing across the window. (Samples taken 0.1 s apart are not
independent, which shrinks the standard error; the growth floors keep a short burst, or a host stall of a few
hundred ms, from passing.) A false stop fails a step the SLO might have passed, a missed one only costs the
rest of the step's time: the floors lean to the second.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from workers.loadgen.stops import Judged, Progress

Z = 3.0  # how many standard errors above zero a slope must be
MIN_GROWTH = 4.0  # the least growth of the in-flight count over the window, requests
GROWTH_FRAC = 0.5  # ... and the least growth relative to the window's mean in-flight count
MIN_POINTS = 10  # the fewest samples of each series the rule judges
WINDOW_S = 4.0  # the window the slopes are taken over, s (a short step: a third of its measured span)
MIN_WINDOW_S = 2.0  # ... but not under 2 s
RATE_FRAC = 0.2  # the least in-flight growth per s, as a share of the arrival rate
SAMPLE_S = 0.1  # how often the load loop samples its in-flight count, s

Samples = Sequence[tuple[float, float]]


def slope(points: Samples) -> tuple[float, float]:
    """The least-squares slope of ``points`` (value per s) and its standard error (inf with under 3 points or
    no spread in time)."""
    n = len(points)
    if n < 3:
        return 0.0, math.inf
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    stt = sum((t - mt) ** 2 for t, _ in points)
    if stt <= 0:
        return 0.0, math.inf
    b = sum((t - mt) * (v - mv) for t, v in points) / stt
    resid = sum((v - mv - b * (t - mt)) ** 2 for t, v in points)
    return b, math.sqrt(resid / (n - 2) / stt)


def _rising(points: Samples) -> float | None:
    """The slope of ``points`` when it is significantly above zero, else None."""
    b, se = slope(points)
    return b if b > 0 and (se == 0 or b > Z * se) else None


def verdict(in_flight: Samples, ttft_ms: Samples, now: float, window_s: float = WINDOW_S,
            rate: float | None = None) -> str | None:
    """Why the server is over-saturated over the last ``window_s`` s before ``now`` (s), or None when it is
    not (or there are too few samples to say). ``in_flight``: requests in flight; ``ttft_ms``: each request's
    time to its first chunk (ms), stamped when that chunk arrived; ``rate``: the arrival rate (requests/s;
    None: no floor from it)."""
    flight = [p for p in in_flight if p[0] >= now - window_s]
    ttft = [p for p in ttft_ms if p[0] >= now - window_s]
    if len(flight) < MIN_POINTS or len(ttft) < MIN_POINTS:
        return None
    grow, climb = _rising(flight), _rising(ttft)
    if grow is None or climb is None:
        return None
    mean = sum(v for _, v in flight) / len(flight)
    if grow * window_s < max(MIN_GROWTH, GROWTH_FRAC * mean) or grow < RATE_FRAC * (rate or 0.0):
        return None
    return (f"over-saturated: requests in flight grew {grow:.1f}/s (mean {mean:.0f}) and TTFT climbed "
            f"{climb:.0f} ms/s over the last {window_s:g} s")


@dataclass(frozen=True, slots=True)
class OverSaturation(Judged):
    """The over-saturation stop as a rule (``stops.StopRule``): judged on the sampler's ticks from one window after
    the warm-up on, over ``window_s`` (:meth:`of`), with the arrival ``rate`` (requests/s) as a floor."""

    window_s: float
    rate: float | None
    sampled: ClassVar[bool] = True
    ends_span: ClassVar[bool] = True

    @classmethod
    def of(cls, measured_s: float, rate: float | None) -> OverSaturation:
        """The rule for a run measuring ``measured_s`` s: a window of ``WINDOW_S``, or a third of the measured span
        if shorter (not under ``MIN_WINDOW_S``)."""
        return cls(min(WINDOW_S, max(MIN_WINDOW_S, measured_s / 3)), rate)

    def should_stop(self, progress: Progress) -> str | None:
        if progress.now < progress.t_start + progress.warmup_s + self.window_s:
            return None
        return verdict(progress.in_flight, progress.first_ms, progress.now, self.window_s, self.rate)

"""The max-goodput search's rule over one serving configuration's open-loop (Poisson) request rate: pure
decisions, no I/O (``scheduler.search`` reads the measured steps and enqueues the next one).

A step *passes* when at least ``SHARE`` (95 %) of its measured requests met the SLO (a request that failed or
was still in flight when the step ended counts as a miss) and the load client did not stop it as
over-saturated. The rate is continuous (AIPerf's ``max_goodput_under_slo``, GuideLLM's sweep bounds):

1. measure the start rate;
2. while every step passed, double the highest passing rate (an exponential search for a failing one);
   while none passed, halve the lowest failing rate (down to ``MIN_RATE``);
3. then bisect between the highest passing rate below the lowest failing one and that failing rate, until the
   bracket is within ``BRACKET`` (5 %) of its low end, or ``MAX_STEPS`` steps were measured.

The answer is the bracket's low end: the highest rate measured to pass. Rates are rounded to three
significant digits (``round_rate``), so a step's rate, and with it its job id, follows from the steps before.
A step that passes above one that failed (noise near the edge) does not move the bracket's high end.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SHARE = 0.95  # the share of requests within the SLO a passing step needs
BRACKET = 0.05  # stop once the failing rate is within 5 % above the passing one
MAX_STEPS = 16  # the most steps one search measures (10 doublings then 5 bisections: 1 to 1000x its start)
MIN_RATE = 0.01  # the lowest rate a search halves down to, requests/s
MAX_RATE = 1_000_000.0  # the highest rate a search doubles up to, requests/s (``schemas.request.MAX_RATE``)
MIN_STEP_REQUESTS = 20  # a step is lengthened until it expects this many measured requests ...
MAX_STEP_S = 300.0  # ... up to this long, s


@dataclass(frozen=True)
class RateStep:
    """One measured step: its rate (requests/s), the share of its measured requests within the SLO (0..1; None:
    the job failed), whether the load client stopped it as over-saturated, and its goodput (requests/s within
    the SLO)."""

    rate: float
    share: float | None
    oversaturated: bool = False
    goodput: float | None = None

    @property
    def passed(self) -> bool:
        return self.share is not None and not self.oversaturated and self.share >= SHARE

    def why_failed(self) -> str:
        """Why a failing step failed, for the search's reason (``""`` for a passing one)."""
        if self.passed:
            return ""
        if self.share is None:
            return "failed"
        if self.oversaturated:
            return "over-saturated"
        return f"{self.share:.0%} within the SLO"


@dataclass(frozen=True)
class GoodputDecision:
    """What a max-goodput search does next: measure ``next`` (requests/s; None: done), the highest passing step
    of the bracket so far (``best``), the lowest failing rate above it (``ceiling``; None: none yet) and why."""

    next: float | None
    best: RateStep | None
    ceiling: float | None
    reason: str

    @property
    def done(self) -> bool:
        return self.next is None


def round_rate(rate: float) -> float:
    """``rate`` (requests/s) to three significant digits: readable, and the same for the same steps."""
    return float(f"{rate:.3g}")


def _bracket(steps: Sequence[RateStep]) -> tuple[RateStep | None, RateStep | None]:
    """The lowest failing step and the highest passing step below it (either None when there is none)."""
    bad = min((s for s in steps if not s.passed), key=lambda s: s.rate, default=None)
    good = max((s for s in steps if s.passed and (bad is None or s.rate < bad.rate)),
               key=lambda s: s.rate, default=None)
    return bad, good


def decide_rate(start: float, steps: Sequence[RateStep], max_steps: int = MAX_STEPS) -> GoodputDecision:
    """The next rate to measure (requests/s) from ``start`` and the measured ``steps`` (any order)."""
    if not steps:
        return GoodputDecision(round_rate(start), None, None, f"first step: rate={round_rate(start):g}/s")
    bad, good = _bracket(steps)
    ceiling = bad.rate if bad else None
    if good is None:
        assert bad is not None
        nxt = round_rate(bad.rate / 2)
        why = f"rate={bad.rate:g}/s {bad.why_failed()}"
        if nxt < MIN_RATE:
            return GoodputDecision(None, None, ceiling, f"stopped: no rate down to {bad.rate:g}/s met the SLO ({why})")
        return _next(nxt, steps, None, ceiling, f"halving ({why}): rate={nxt:g}/s next", max_steps)
    if bad is None:
        nxt = round_rate(good.rate * 2)
        if nxt > MAX_RATE:
            return GoodputDecision(None, good, None, f"stopped: rate={good.rate:g}/s met the SLO and the next "
                                                     f"doubling is over {MAX_RATE:g}/s")
        return _next(nxt, steps, good, None, f"doubling: rate={nxt:g}/s next", max_steps)
    if bad.rate <= good.rate * (1 + BRACKET):
        return GoodputDecision(None, good, ceiling, f"max goodput rate {good.rate:g} req/s (rate={bad.rate:g}/s "
                                                    f"{bad.why_failed()})")
    nxt = round_rate((good.rate + bad.rate) / 2)
    return _next(nxt, steps, good, ceiling, f"bisecting {good.rate:g}..{bad.rate:g}/s: rate={nxt:g}/s next",
                 max_steps)


def _next(nxt: float, steps: Sequence[RateStep], good: RateStep | None, ceiling: float | None, reason: str,
          max_steps: int) -> GoodputDecision:
    """Measure ``nxt`` unless the step cap is reached or rounding lands on a measured rate."""
    if len(steps) >= max_steps:
        head = f"max goodput rate {good.rate:g} req/s" if good else "no rate met the SLO"
        return GoodputDecision(None, good, ceiling, f"{head} (stopped at the cap of {max_steps} steps"
                                                    f"{'' if ceiling is None else f'; fails at {ceiling:g}/s'})")
    if any(s.rate == nxt for s in steps):
        head = f"max goodput rate {good.rate:g} req/s" if good else "no rate met the SLO"
        return GoodputDecision(None, good, ceiling, f"{head} (the bracket cannot narrow at 3 significant digits)")
    return GoodputDecision(nxt, good, ceiling, reason)


def step_duration(duration_s: float | None, windows_s: float, rate: float) -> float | None:
    """The measured time (s) of a step at ``rate`` (requests/s): its ``duration_s`` (None: its windows, at
    most ``windows_s`` long) unless that expects under ``MIN_STEP_REQUESTS`` requests, then long enough for
    them (up to ``MAX_STEP_S``): at a low rate, a step of a few requests judges the 95 % rule on noise, and one
    of none fails."""
    measured = duration_s if duration_s is not None else windows_s
    if measured * rate >= MIN_STEP_REQUESTS:
        return duration_s
    return round(min(max(measured, MAX_STEP_S), MIN_STEP_REQUESTS / rate), 1)


def max_steps_for(start: float, answer: float) -> int:
    """The steps the search takes to bracket ``answer`` from ``start`` (requests/s) when every step is judged
    exactly (a capacity that is a step function): for the benchmark's and the docs' expectation."""
    steps: list[RateStep] = []
    while True:
        d = decide_rate(start, steps)
        if d.next is None:
            return len(steps)
        steps.append(RateStep(d.next, 1.0 if d.next <= answer else 0.0))

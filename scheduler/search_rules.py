"""The quick search's rule over the load level (concurrency, or the request rate in open loop) of one serving
configuration: pure decisions, no I/O (``scheduler.search`` reads the steps measured and enqueues the next).

* Without a latency budget (Model Analyzer's early exit): the level rises through the list until the
  throughput of the newest step gains less than ``GAIN`` over the step two before it, a step fails, or the
  list ends (once the server saturates, neither more concurrency nor a higher offered rate adds throughput).
* With ``p99_ms`` (perf_analyzer's latency threshold): a binary search for the highest level whose p99
  stays within the budget, assuming p99 grows with the level; a failed step, or one without a p99 (a
  client-limited open-loop run), counts as over it; the pick is the highest throughput among the steps
  within the budget.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GAIN = 0.05  # smallest throughput gain over two steps that keeps the early-exit climb going (5 %)


@dataclass(frozen=True)
class Step:
    """One measured step: its level (concurrency, or open-loop rate in requests/s), throughput (inferences/s;
    None: the job failed) and p99 (ms)."""

    level: int | float
    throughput: float | None
    p99_ms: float | None = None


@dataclass(frozen=True)
class Decision:
    """What a search does next: measure ``next`` (None: done), its best step so far and why."""

    next: int | float | None
    best: Step | None
    reason: str

    @property
    def done(self) -> bool:
        return self.next is None


def _within(step: Step, budget: float | None) -> bool:
    if step.throughput is None:
        return False
    return budget is None or (step.p99_ms is not None and step.p99_ms <= budget)


def _best(steps: Sequence[Step], budget: float | None) -> Step | None:
    ok = [s for s in steps if _within(s, budget)]
    return max(ok, key=lambda s: (s.throughput or 0.0, -s.level)) if ok else None


def label(level: int | float, load: str = "concurrency") -> str:
    """A search level for humans: ``c=4`` (concurrency) or ``rate=100/s`` (open-loop rate)."""
    return f"rate={level:g}/s" if load == "rate" else f"c={level}"


def decide(levels: Sequence[int | float], steps: Sequence[Step], p99_ms: float | None = None,
           load: str = "concurrency") -> Decision:
    """The next level to measure given the measured ``steps`` (levels sorted ascending; ``load``: what they
    are, ``concurrency`` or ``rate``, for the reason's words)."""
    if p99_ms is not None:
        return _bisect(levels, steps, p99_ms, load)
    measured = {s.level: s for s in steps}
    seq: list[Step] = []
    for level in levels:
        step = measured.get(level)
        if step is None:
            return Decision(level, _best(seq, None), f"climbing: {label(level, load)} next")
        seq.append(step)
        if step.throughput is None:
            return Decision(None, _best(seq, None), f"stopped: {label(level, load)} failed")
        if len(seq) >= 3 and step.throughput < (1 + GAIN) * (seq[-3].throughput or 0.0):
            return Decision(None, _best(seq, None), f"stopped at {label(level, load)}: throughput gained under "
                            f"{GAIN:.0%} over the last two steps")
    return Decision(None, _best(seq, None), f"stopped: end of the {load} list")


def _bisect(levels: Sequence[int | float], steps: Sequence[Step], budget: float, load: str) -> Decision:
    index = {lv: i for i, lv in enumerate(levels)}
    bad = [index[s.level] for s in steps if s.level in index and not _within(s, budget)]
    hi = min(bad, default=len(levels))
    lo = max((index[s.level] for s in steps if s.level in index and _within(s, budget) and index[s.level] < hi),
             default=-1)
    best = _best([s for s in steps if s.level in index and index[s.level] <= lo], budget)
    if hi - lo > 1:
        nxt = levels[(lo + hi) // 2]
        return Decision(nxt, best, f"bisecting {load} {levels[lo] if lo >= 0 else 0:g}..{levels[hi - 1]:g}: "
                                   f"{label(nxt, load)} next")
    if best is None:
        return Decision(None, None, f"stopped: {label(levels[0], load)} already exceeds p99 {budget:g} ms")
    return Decision(None, best, f"stopped: the highest {load} within p99 {budget:g} ms is "
                    f"{label(levels[lo], load)}; best throughput at {label(best.level, load)}")


def first_level(levels: Sequence[int | float], p99_ms: float | None) -> int | float:
    """The level (concurrency or rate) a quick search measures first."""
    nxt = decide(levels, [], p99_ms).next
    assert nxt is not None  # an empty search always has a first step
    return nxt

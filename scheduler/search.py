"""Quick search over concurrency, per serving configuration: pure decisions, plus the one step that
turns them into jobs (``advance``).

A serving configuration is a job's coordinates less its concurrency (device, engine, batch size and the
``SERVING_KEYS`` of its measurement). Its search space is the request's concurrency list, in order.

* Without a latency budget (Model Analyzer's early exit): concurrency rises through the list until the
  throughput of the newest step gains less than ``GAIN`` over the step two before it, a step fails, or the
  list ends.
* With ``p99_ms`` (perf_analyzer's latency threshold): a binary search for the highest concurrency whose
  p99 stays within the budget, assuming p99 grows with concurrency; the pick is the highest throughput
  among the steps within the budget.

The next step of a search is enqueued when the previous result lands: ``advance`` is called after every
result write of a search job (``workers.ledger.finish``) and on every reconciliation pass, so a worker
dying mid-step only delays the search (its job is requeued like any other).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GAIN = 0.05  # smallest throughput gain over two steps that keeps the early-exit climb going (5 %)


@dataclass(frozen=True)
class Step:
    """One measured step: its concurrency, throughput (inferences/s; None: the job failed) and p99 (ms)."""

    level: int
    throughput: float | None
    p99_ms: float | None = None


@dataclass(frozen=True)
class Decision:
    """What a search does next: measure ``next`` (None: done), its best step so far and why."""

    next: int | None
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


def decide(levels: Sequence[int], steps: Sequence[Step], p99_ms: float | None = None) -> Decision:
    """The next concurrency to measure given the measured ``steps`` (levels must be sorted ascending)."""
    if p99_ms is not None:
        return _bisect(levels, steps, p99_ms)
    measured = {s.level: s for s in steps}
    seq: list[Step] = []
    for level in levels:
        step = measured.get(level)
        if step is None:
            return Decision(level, _best(seq, None), f"climbing: c={level} next")
        seq.append(step)
        if step.throughput is None:
            return Decision(None, _best(seq, None), f"stopped: c={level} failed")
        if len(seq) >= 3 and step.throughput < (1 + GAIN) * (seq[-3].throughput or 0.0):
            return Decision(None, _best(seq, None), f"stopped at c={level}: throughput gained under "
                            f"{GAIN:.0%} over the last two steps")
    return Decision(None, _best(seq, None), "stopped: end of the concurrency list")


def _bisect(levels: Sequence[int], steps: Sequence[Step], budget: float) -> Decision:
    index = {lv: i for i, lv in enumerate(levels)}
    bad = [index[s.level] for s in steps if s.level in index and not _within(s, budget)]
    hi = min(bad, default=len(levels))
    lo = max((index[s.level] for s in steps if s.level in index and _within(s, budget) and index[s.level] < hi),
             default=-1)
    best = _best([s for s in steps if s.level in index and index[s.level] <= lo], budget)
    if hi - lo > 1:
        nxt = levels[(lo + hi) // 2]
        return Decision(nxt, best, f"bisecting c={levels[lo] if lo >= 0 else 0}..{levels[hi - 1]}: c={nxt} next")
    if best is None:
        return Decision(None, None, f"stopped: c={levels[0]} already exceeds p99 {budget:g} ms")
    return Decision(None, best, f"stopped: the highest concurrency within p99 {budget:g} ms is c={levels[lo]}; "
                    f"best throughput at c={best.level}")


def first_level(levels: Sequence[int], p99_ms: float | None) -> int:
    """The concurrency a quick search measures first."""
    nxt = decide(levels, [], p99_ms).next
    assert nxt is not None  # an empty search always has a first step
    return nxt


def serving_key(spec: dict[str, Any]) -> tuple[Any, ...]:
    """A job spec's (JSON) serving configuration: its coordinates less concurrency."""
    from schemas import SERVING_KEYS

    m = spec.get("measurement") or {}
    return (spec["device"], spec["engine"], spec["batch_size"], *(m.get(k) for k in SERVING_KEYS))

"""The knee of an LLM concurrency sweep: the concurrency past which more concurrent requests stop buying output
tokens/s (GuideLLM's and inference-perf's "saturation" point, said as one number a reader can act on).

The rule (kept as plain arithmetic rather than a Kneedle library: the sweeps are 3-10 points on doubling
concurrencies, where Kneedle's normalised-difference curve is dominated by its end points and moves with one
noisy run): walk the points in order of concurrency; each step's *gain per doubling* is
``(y_i / y_{i-1}) ** (1 / log2(c_i / c_{i-1})) - 1`` (a step from c=4 to c=16 counts as two doublings). The knee
is the last point reached while every step so far gained at least ``min_gain_pct`` (default
:data:`KNEE_GAIN_PCT`, 10 %) per doubling: the first step below it ends the climb. A sweep whose every step
gains enough has its knee at its last point, flagged ``saturated=False`` (the curve had not flattened yet: sweep
higher). Fewer than two points have no knee.

An open-loop rate sweep gets its knee by the same rule on (offered rate, output tokens/s) (``by="rate"``): the
offered rate past which more requests/s stop buying tokens/s. Why a sweep bends there is ``farm.readers.knee_cause``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from farm.readers.rows import ResultRow, as_rows

#: the least gain in output tokens/s per doubling of concurrency that still counts as climbing, %
KNEE_GAIN_PCT = 10.0
#: the metric a knee is found on
KNEE_METRIC = "output_tokens_per_s"
#: what a sweep varies: closed-loop concurrency or the open-loop offered rate (requests/s)
SWEEP_LOADS = ("concurrency", "rate")


@dataclass(frozen=True)
class Knee:
    """The knee of one sweep: its ``concurrency`` and ``tokens_per_s`` there; ``next_gain_pct``: the gain per
    doubling of the step after it (%, None at the last point); ``saturated``: a later step gained less than
    the threshold (False: the sweep ended still climbing); ``points``: the sweep's points; ``by``: what the sweep
    varies (``concurrency``, or ``rate``: then ``concurrency`` holds the offered rate, requests/s)."""

    concurrency: float
    tokens_per_s: float
    next_gain_pct: float | None
    saturated: bool
    points: int
    by: str = "concurrency"

    def as_json(self, sweep: str) -> dict[str, Any]:
        """The knee of sweep ``sweep`` as ``--json`` prints it (``farm report``, ``farm status``)."""
        return {"sweep": sweep, self.by: self.concurrency, "output_tokens_per_s": self.tokens_per_s,
                "saturated": self.saturated, "next_gain_pct": self.next_gain_pct}

    def at(self, load: float | None = None) -> str:
        """``c=8`` (or ``4 req/s`` for a rate sweep) of ``load`` (default: the knee's)."""
        load = self.concurrency if load is None else load
        return f"c={load:g}" if self.by == "concurrency" else f"{load:g} req/s"

    def text(self) -> str:
        """``knee at c=8: 1,900 tok/s`` (``(still climbing at the sweep's end)`` when not saturated)."""
        tail = "" if self.saturated else " (still climbing at the sweep's end: sweep higher)"
        return f"knee at {self.at()}: {self.tokens_per_s:,.0f} tok/s{tail}"


def gain_per_doubling_pct(c0: float, y0: float, c1: float, y1: float) -> float:
    """The gain of the step (c0, y0) -> (c1, y1) per doubling of ``c``, % (c1 > c0 > 0, y0 > 0)."""
    doublings = math.log2(c1 / c0)
    return 100.0 * (float((max(y1, 0.0) / y0) ** (1.0 / doublings)) - 1.0)


def find_knee(points: Iterable[tuple[float, float]], min_gain_pct: float = KNEE_GAIN_PCT) -> Knee | None:
    """The knee of (concurrency, output tokens/s) ``points`` by the module's rule; points at one concurrency are
    averaged, points without a positive concurrency or a positive rate are left out. None below two points."""
    by_c: dict[float, list[float]] = {}
    for c, y in points:
        if c is not None and y is not None and c > 0 and y > 0:
            by_c.setdefault(float(c), []).append(float(y))
    curve = sorted((c, sum(ys) / len(ys)) for c, ys in by_c.items())
    if len(curve) < 2:
        return None
    for i in range(1, len(curve)):
        (c0, y0), (c1, y1) = curve[i - 1], curve[i]
        gain = gain_per_doubling_pct(c0, y0, c1, y1)
        if gain < min_gain_pct:
            return Knee(c0, y0, gain, True, len(curve))
    c, y = curve[-1]
    return Knee(c, y, None, False, len(curve))


def sweep_key(row: ResultRow) -> tuple[Any, ...]:
    """What one concurrency sweep holds fixed: device, engine, batch size, the knobs asked for and the edge
    profile (closed loop only: an open-loop row belongs to a rate sweep)."""
    return (row.get("device"), row.get("engine"), row.get("batch_size"), row.get("knob_set"), row.get("edge_profile"))


def sweep_label(key: Sequence[Any]) -> str:
    """``cpu llama.cpp n_parallel=4`` for a :func:`sweep_key`."""
    device, engine, _b, knobs, edge = key
    parts = [str(device), str(engine)] + ([str(knobs)] if knobs else []) + ([f"edge {edge}"] if edge else [])
    return " ".join(parts)


def sweep_load(row: ResultRow, by: str) -> float | None:
    """The load ``row`` ran at in a sweep of ``by`` (``SWEEP_LOADS``): its concurrency in closed loop, its offered
    rate in open loop; None where the row belongs to the other kind of sweep."""
    if by == "rate":
        return row.rate
    return None if row.rate is not None else row.get("concurrency")


def sweeps(rows: Iterable[ResultRow], by: str = "concurrency") -> dict[tuple[Any, ...], list[ResultRow]]:
    """The succeeded rows with output tokens/s of each sweep of ``by`` (``sweep_key``), in row order."""
    out: dict[tuple[Any, ...], list[ResultRow]] = {}
    for r in as_rows(rows):
        if r.succeeded and sweep_load(r, by) is not None and r.get(KNEE_METRIC) is not None:
            out.setdefault(sweep_key(r), []).append(r)
    return out


def knee_of(rows: list[ResultRow], by: str = "concurrency", min_gain_pct: float = KNEE_GAIN_PCT) -> Knee | None:
    """The knee of one sweep's ``rows`` (``sweeps``) of ``by``."""
    knee = find_knee(((sweep_load(r, by) or 0.0, r[KNEE_METRIC]) for r in rows), min_gain_pct)
    return None if knee is None else replace(knee, by=by)


def knees(rows: Iterable[ResultRow], min_gain_pct: float = KNEE_GAIN_PCT, by: str = "concurrency"
          ) -> list[tuple[str, Knee]]:
    """The knee of each sweep of ``by`` (closed-loop concurrency by default, or open-loop ``rate``) among result
    ``rows`` (succeeded, with output tokens/s; two loads at least), as (sweep label, knee), in label order."""
    out = []
    for key, swept in sweeps(rows, by).items():
        knee = knee_of(swept, by, min_gain_pct)
        if knee is not None:
            out.append((sweep_label(key), knee))
    return sorted(out, key=lambda kv: kv[0])

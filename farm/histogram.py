"""The latency histogram farm stores with a result: log-spaced buckets on one fixed grid, JSON-storable.

Written by the load clients (``workers.loadgen``), read by the core (comparisons, reports): the codec lives
here so the core reads what it stores without importing the workers. Values are milliseconds.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from schemas.load import Histogram

HIST_PER_DECADE = 50  # buckets per factor of 10: each bucket is ~4.7 % wide
HIST_MIN_INDEX = -4 * HIST_PER_DECADE  # values below 1e-4 ms (0.1 us) go to the first bucket
HIST_MAX_INDEX = 7 * HIST_PER_DECADE  # values above 1e7 ms (~2.8 h) go to the last bucket


def bucket_index(value_ms: float) -> int:
    """Index ``i`` of the log bucket ``[10**(i/D), 10**((i+1)/D))`` ms holding ``value_ms`` (D per decade)."""
    if math.isnan(value_ms) or value_ms <= 0:
        return HIST_MIN_INDEX
    if math.isinf(value_ms):
        return HIST_MAX_INDEX
    i = math.floor(math.log10(value_ms) * HIST_PER_DECADE)
    return max(HIST_MIN_INDEX, min(HIST_MAX_INDEX, i))


def bucket_bound(index: int) -> float:
    """Lower bound in ms of bucket ``index`` (the upper bound of ``index - 1``)."""
    return float(10.0 ** (index / HIST_PER_DECADE))


def histogram(values_ms: Sequence[float] | np.ndarray) -> Histogram:
    """A JSON-storable latency histogram with log-spaced buckets.

    ``{"per_decade": D, "first_index": i0, "bounds_ms": [...], "counts": [...], "count": n,
    "sum_ms": s, "min_ms": lo, "max_ms": hi}``: ``counts[j]`` counts values in
    ``[bounds_ms[j], bounds_ms[j+1])``; only the span from the first to the last non-empty bucket is kept.
    Histograms built here share one bucket grid, so :func:`merge_histograms` adds them exactly.
    """
    a = np.asarray(values_ms, dtype=np.float64)
    if a.size == 0:
        return _hist_from_counts({}, 0, 0.0, None, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        idx = np.floor(np.log10(a) * HIST_PER_DECADE)
    idx = np.nan_to_num(idx, nan=HIST_MIN_INDEX, neginf=HIST_MIN_INDEX, posinf=HIST_MAX_INDEX)
    idx = np.clip(idx, HIST_MIN_INDEX, HIST_MAX_INDEX).astype(np.int64)
    uniq, cnt = np.unique(idx, return_counts=True)
    counts = {int(i): int(c) for i, c in zip(uniq, cnt, strict=True)}
    return _hist_from_counts(counts, int(a.size), float(a.sum()), float(a.min()), float(a.max()))


def _hist_from_counts(
    counts: dict[int, int], n: int, total: float, lo: float | None, hi: float | None
) -> Histogram:
    if not counts:
        return {"per_decade": HIST_PER_DECADE, "first_index": 0, "bounds_ms": [], "counts": [],
                "count": 0, "sum_ms": 0.0, "min_ms": None, "max_ms": None}
    first, last = min(counts), max(counts)
    dense = [counts.get(i, 0) for i in range(first, last + 1)]
    bounds = [bucket_bound(i) for i in range(first, last + 2)]
    return {"per_decade": HIST_PER_DECADE, "first_index": first, "bounds_ms": bounds, "counts": dense,
            "count": n, "sum_ms": total, "min_ms": lo, "max_ms": hi}


def bucket_counts(hist: Histogram) -> dict[int, int]:
    """A stored histogram's non-empty buckets: grid index -> count."""
    first = int(hist.get("first_index", 0))
    return {first + j: int(c) for j, c in enumerate(hist.get("counts") or []) if c}


def merge_histograms(hists: Iterable[Histogram]) -> Histogram:
    """Add histograms built by :func:`histogram` (same bucket grid) into one."""
    counts: dict[int, int] = {}
    n, total = 0, 0.0
    lo: float | None = None
    hi: float | None = None
    for h in hists:
        if h.get("per_decade", HIST_PER_DECADE) != HIST_PER_DECADE:
            raise ValueError(f"cannot merge a histogram with {h['per_decade']} buckets per decade "
                             f"into one with {HIST_PER_DECADE}; rebuild it from raw samples")
        for i, c in bucket_counts(h).items():
            counts[i] = counts.get(i, 0) + c
        n += int(h["count"])
        total += float(h["sum_ms"])
        h_lo, h_hi = h.get("min_ms"), h.get("max_ms")
        if h_lo is not None:
            lo = h_lo if lo is None else min(lo, h_lo)
        if h_hi is not None:
            hi = h_hi if hi is None else max(hi, h_hi)
    return _hist_from_counts(counts, n, total, lo, hi)


def histogram_quantile(hist: Histogram, q: float) -> float | None:
    """The ``q``-th percentile (0..100) estimated from a histogram: linear within the bucket reached,
    clamped to the recorded min/max. Error is at most one bucket width (~4.7 %). None when empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    n = int(hist["count"])
    if n == 0:
        return None
    lo_v, hi_v = hist.get("min_ms"), hist.get("max_ms")
    if q <= 0 and lo_v is not None:
        return float(lo_v)
    if q >= 100 and hi_v is not None:
        return float(hi_v)
    rank = q / 100.0 * n
    bounds, counts = hist["bounds_ms"], hist["counts"]
    cum = 0
    for j, c in enumerate(counts):
        if c and cum + c >= rank:
            frac = (rank - cum) / c
            value = bounds[j] + (bounds[j + 1] - bounds[j]) * frac
            if lo_v is not None:
                value = max(value, float(lo_v))
            if hi_v is not None:
                value = min(value, float(hi_v))
            return float(value)
        cum += c
    return float(hi_v) if hi_v is not None else float(bounds[-1])


def histogram_mean(hist: Histogram) -> float | None:
    """Exact mean in ms of the values a histogram was built from; None when empty."""
    n = int(hist["count"])
    return float(hist["sum_ms"]) / n if n else None

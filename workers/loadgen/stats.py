"""Pure statistics helpers for the load generator: percentiles, log-bucket histograms, stability.

Latencies are in milliseconds throughout. Nothing here does I/O or keeps state between calls.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

HIST_PER_DECADE = 50  # buckets per factor of 10: each bucket is ~4.7 % wide
HIST_MIN_INDEX = -4 * HIST_PER_DECADE  # values below 1e-4 ms (0.1 us) go to the first bucket
HIST_MAX_INDEX = 7 * HIST_PER_DECADE  # values above 1e7 ms (~2.8 h) go to the last bucket


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation between closest ranks,
    the same as ``numpy.percentile(values, q, method="linear")``; None when ``values`` is empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    a = np.sort(np.asarray(values, dtype=np.float64), kind="stable")
    return _sorted_percentile(a, q)


def percentiles(values: Sequence[float] | np.ndarray, qs: Iterable[float]) -> list[float | None]:
    """Several percentiles of ``values`` (one sort); each as :func:`percentile`."""
    a = np.sort(np.asarray(values, dtype=np.float64), kind="stable")
    return [_sorted_percentile(a, q) for q in qs]


def mean(values: Sequence[float] | np.ndarray) -> float | None:
    """The mean of ``values``; None when empty."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()) if a.size else None


def _sorted_percentile(a: np.ndarray, q: float) -> float | None:
    n = a.size
    if n == 0:
        return None
    h = (n - 1) * (q / 100.0)
    lo = int(math.floor(h))
    hi = min(lo + 1, n - 1)
    frac = h - lo
    return float(a[lo] + (a[hi] - a[lo]) * frac)


# --------------------------------------------------------------------------- histogram

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
    return 10.0 ** (index / HIST_PER_DECADE)


def histogram(values_ms: Sequence[float] | np.ndarray) -> dict[str, Any]:
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
) -> dict[str, Any]:
    if not counts:
        return {"per_decade": HIST_PER_DECADE, "first_index": 0, "bounds_ms": [], "counts": [],
                "count": 0, "sum_ms": 0.0, "min_ms": None, "max_ms": None}
    first, last = min(counts), max(counts)
    dense = [counts.get(i, 0) for i in range(first, last + 1)]
    bounds = [bucket_bound(i) for i in range(first, last + 2)]
    return {"per_decade": HIST_PER_DECADE, "first_index": first, "bounds_ms": bounds, "counts": dense,
            "count": n, "sum_ms": total, "min_ms": lo, "max_ms": hi}


def merge_histograms(hists: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Add histograms built by :func:`histogram` (same bucket grid) into one."""
    counts: dict[int, int] = {}
    n, total = 0, 0.0
    lo: float | None = None
    hi: float | None = None
    for h in hists:
        if h.get("per_decade", HIST_PER_DECADE) != HIST_PER_DECADE:
            raise ValueError(f"cannot merge a histogram with {h['per_decade']} buckets per decade "
                             f"into one with {HIST_PER_DECADE}; rebuild it from raw samples")
        first = int(h["first_index"])
        for j, c in enumerate(h["counts"]):
            if c:
                counts[first + j] = counts.get(first + j, 0) + int(c)
        n += int(h["count"])
        total += float(h["sum_ms"])
        if h.get("min_ms") is not None:
            lo = h["min_ms"] if lo is None else min(lo, h["min_ms"])
        if h.get("max_ms") is not None:
            hi = h["max_ms"] if hi is None else max(hi, h["max_ms"])
    return _hist_from_counts(counts, n, total, lo, hi)


def histogram_quantile(hist: dict[str, Any], q: float) -> float | None:
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


def histogram_mean(hist: dict[str, Any]) -> float | None:
    """Exact mean in ms of the values a histogram was built from; None when empty."""
    n = int(hist["count"])
    return float(hist["sum_ms"]) / n if n else None


# --------------------------------------------------------------------------- stability

def within_pct(values: Sequence[float | None], pct: float) -> bool:
    """True when every value lies within ±``pct`` % of the values' mean (all present, mean > 0)."""
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return False
    vals = [float(v) for v in values if v is not None]
    mean = sum(vals) / len(vals)
    if mean <= 0:
        return False
    bound = mean * pct / 100.0
    return all(abs(v - mean) <= bound for v in vals)


def stability_keys(latency: str) -> tuple[str, str]:
    """The window figures the stability rule compares: throughput and the ``latency`` (mean|p50|p99)."""
    return ("throughput_infer_per_s", f"{latency}_ms")


def is_stable(windows: Sequence[dict[str, Any]], min_windows: int, stability_pct: float,
              keys: Sequence[str] = stability_keys("mean")) -> bool:
    """Whether the last ``min_windows`` window summaries agree within ±``stability_pct`` % on each of
    ``keys`` (default: throughput and mean latency, perf_analyzer's rule). Fewer windows than
    ``min_windows`` is not stable."""
    if min_windows < 1:
        raise ValueError(f"min_windows must be >= 1, got {min_windows}")
    if len(windows) < min_windows:
        return False
    last = windows[-min_windows:]
    return all(within_pct([w.get(k) for w in last], stability_pct) for k in keys)


def stable_since(windows: Sequence[dict[str, Any]], min_windows: int, stability_pct: float,
                 keys: Sequence[str] = stability_keys("mean")) -> int | None:
    """The first window count ``n`` at which :func:`is_stable` holds for ``windows[:n]``, or None."""
    for n in range(min_windows, len(windows) + 1):
        if is_stable(windows[:n], min_windows, stability_pct, keys):
            return n
    return None


def summarize_latencies(lat_ms: np.ndarray) -> dict[str, float | None]:
    """Mean, p50/p90/p95/p99/p99.9, max and standard deviation (population) of latencies in ms."""
    a = np.asarray(lat_ms, dtype=np.float64)
    if a.size == 0:
        return {k: None for k in ("mean", "p50", "p90", "p95", "p99", "p999", "max", "std")}
    p50, p90, p95, p99, p999 = percentiles(a, (50, 90, 95, 99, 99.9))
    return {"mean": float(a.mean()), "p50": p50, "p90": p90, "p95": p95, "p99": p99, "p999": p999,
            "max": float(a.max()), "std": float(a.std())}


def latency_metrics(lat_ms: Sequence[float] | np.ndarray, batch_size: int, duration_s: float
                    ) -> dict[str, float | None]:
    """The latency and rate metrics (``schemas.metrics`` names) of requests that completed within
    ``duration_s`` seconds: ``latency_*_ms`` per request, ``requests_per_s`` and
    ``throughput_infer_per_s`` (``batch_size`` samples per request)."""
    a = np.asarray(lat_ms, dtype=np.float64)
    s = summarize_latencies(a)
    return {
        "throughput_infer_per_s": a.size * batch_size / duration_s,
        "requests_per_s": a.size / duration_s,
        "latency_mean_ms": s["mean"], "latency_p50_ms": s["p50"], "latency_p90_ms": s["p90"],
        "latency_p95_ms": s["p95"], "latency_p99_ms": s["p99"], "latency_p999_ms": s["p999"],
        "latency_max_ms": s["max"], "latency_std_ms": s["std"],
    }


CLIENT_SHARE_PCT = 5.0  # closed loop: a client busier than this per outstanding request is flagged


def client_share_note(busy_pct: float, concurrency: int, mode: str, client: str) -> str | None:
    """A note when the client's own CPU time is a visible part of what it measured (closed loop): each of
    ``concurrency`` outstanding requests spends about ``busy_pct / concurrency`` % of its cycle in the
    client's hands (building, sending, receiving, recording), time that shows up in the latency and, at
    low concurrency, in the throughput. None under :data:`CLIENT_SHARE_PCT` or in open loop (late sends
    flag an open-loop client)."""
    share = busy_pct / max(concurrency, 1)
    if mode != "closed" or share <= CLIENT_SHARE_PCT:
        return None
    lighter = "" if client == "perf_analyzer" else "a lighter client (perf_analyzer: --client auto where installed) or "
    return (f"client cost: {client} was {busy_pct:.0f} % busy at concurrency {concurrency}, so up to about "
            f"{share:.0f} % of each request's cycle can be its own CPU time, which then counts in the latency "
            f"and throughput; {lighter}a higher concurrency shrinks it")

"""Pure statistics helpers for the load clients: percentiles, stability, the latency metrics (and, re-exported
from ``farm.histogram``, the log-bucket histogram).

Latencies are in milliseconds throughout. Nothing here does I/O or keeps state between calls.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# the histogram codec is farm's core's (it reads what it stores); the load clients write it through here
from farm.histogram import (  # noqa: F401 (re-exported)
    HIST_MAX_INDEX,
    HIST_MIN_INDEX,
    HIST_PER_DECADE,
    bucket_bound,
    bucket_index,
    histogram,
    histogram_mean,
    histogram_quantile,
    merge_histograms,
)


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


def client_share_note(busy_pct: float, concurrency: int | None, client: str) -> str | None:
    """A note when the client's own CPU time is a visible part of what it measured (closed loop): each of
    ``concurrency`` outstanding requests spends about ``busy_pct / concurrency`` % of its cycle in the
    client's hands (building, sending, receiving, recording), time that shows up in the latency and, at
    low concurrency, in the throughput. None under :data:`CLIENT_SHARE_PCT` or in open loop (``concurrency``
    None: late sends flag an open-loop client)."""
    if concurrency is None:
        return None
    share = busy_pct / max(concurrency, 1)
    if share <= CLIENT_SHARE_PCT:
        return None
    lighter = "" if client == "perf_analyzer" else "a lighter client (--client perf_analyzer) or "
    return (f"client cost: {client} was {busy_pct:.0f} % busy at concurrency {concurrency}, so up to about "
            f"{share:.0f} % of each request's cycle can be its own CPU time, which then counts in the latency "
            f"and throughput; {lighter}a higher concurrency shrinks it")

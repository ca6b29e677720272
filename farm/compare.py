"""Two requests compared configuration by configuration, with a verdict that accounts for run-to-run noise.

Configurations match by their coordinates (``farm.results.CONFIG_COLUMNS``, minus any the caller ignores,
e.g. ``engine`` to compare two engines). For each match the verdict uses what the runs stored, not a bare
ratio of two numbers:

* throughput: Welch's t-test over the per-window throughputs of the windows the metrics were taken from;
* latency: the Mann-Whitney U test over the two latency histograms (same log-bucket grid, ties per bucket)
  and, since requests of one run are not independent, Welch's t-test over the per-window p50s; the larger
  p-value of the two counts.

A change is *significant* when its test's p-value is below ``alpha``; it counts as faster/slower only when it
is also larger than a practical threshold (``min_effect_pct``): with thousands of requests per run any shift
is "significant", and two runs of the same model on a shared machine differ by a few per cent.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from farm.histogram import bucket_counts, histogram_quantile, merge_histograms
from farm.results import CONFIG_COLUMNS, METRIC_NAMES, load_details, merge_repeats
from farm.settings import get_settings
from schemas.job import JobStatus
from schemas.result import host_flags

SAME, FASTER, SLOWER = "no significant difference", "faster", "slower"
UNDECIDED = "undecided (no stored windows or histogram)"
FAILED = "not comparable (a side did not succeed)"
#: the ratio columns of a comparison: (metric, label); B / A
RATIOS = (("throughput_infer_per_s", "throughput"), ("latency_p50_ms", "p50"), ("latency_p99_ms", "p99"),
          ("mem_peak_bytes", "memory"))


@dataclass
class Test:
    """One metric's change B vs A: ``change_pct`` (+ = B higher), p-value, and whether B is worse/better."""

    metric: str
    change_pct: float
    p_value: float
    worse: bool
    better: bool


@dataclass
class Match:
    """One configuration present in both requests."""

    key: dict[str, Any]
    a: dict[str, Any]
    b: dict[str, Any]
    ratios: dict[str, float | None]
    tests: list[Test]
    verdict: str
    regression_pct: float  # the largest significant worsening beyond the threshold, in % (0 when none)
    flags: list[str] = field(default_factory=list)  # runs whose host drifted or was busy (``host_marks``)


@dataclass
class Comparison:
    ignore: tuple[str, ...]
    min_effect_pct: float
    alpha: float
    matches: list[Match] = field(default_factory=list)
    only_a: list[dict[str, Any]] = field(default_factory=list)
    only_b: list[dict[str, Any]] = field(default_factory=list)

    def regressions(self, pct: float) -> list[Match]:
        """The matches judged slower whose worsening is at least ``pct`` %."""
        return [m for m in self.matches if m.verdict == SLOWER and m.regression_pct >= pct]


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of Welch's t-test (unequal variances); 1.0 when either side has < 2 values."""
    if len(a) < 2 or len(b) < 2:
        return 1.0
    from scipy.stats import ttest_ind  # noqa: PLC0415 - scipy.stats costs ~2 s and ~70 MiB, only for a verdict

    p = float(ttest_ind(a, b, equal_var=False).pvalue)
    return 1.0 if math.isnan(p) else p


def mann_whitney_hist(ha: dict[str, Any], hb: dict[str, Any]) -> float:
    """Two-sided p-value of the Mann-Whitney U test between the samples two latency histograms (built by
    ``farm.histogram.histogram``: one bucket grid) were made from; values in one bucket are ties.
    Normal approximation with tie correction; 1.0 when either is empty."""
    ca, cb = bucket_counts(ha), bucket_counts(hb)
    n1, n2 = sum(ca.values()), sum(cb.values())
    if n1 == 0 or n2 == 0:
        return 1.0
    u, below_a, ties = 0.0, 0, 0.0
    for i in sorted(set(ca) | set(cb)):
        a_i, b_i = ca.get(i, 0), cb.get(i, 0)
        u += b_i * (below_a + 0.5 * a_i)  # pairs where the B value exceeds (or ties) the A value
        below_a += a_i
        t = a_i + b_i
        ties += t ** 3 - t
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2.0) / math.sqrt(var)
    return math.erfc(abs(z) / math.sqrt(2.0))


def window_values(details: dict[str, Any], key: str = "throughput_infer_per_s") -> list[float]:
    """``key`` (throughput in inferences/s, ``p50_ms``, ...) of each window the run's metrics were taken from
    (warm-up excluded)."""
    wins = details.get("windows") or []
    used = details.get("metrics_windows")
    if used:
        wins = [w for w in wins if used[0] <= w.get("k", -1) <= used[1]]
    return [float(w[key]) for w in wins if w.get(key) is not None]


def _change(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a == 0 else 100.0 * (b / a - 1.0)


def judge(a: dict[str, Any], b: dict[str, Any], det_a: list[dict[str, Any]], det_b: list[dict[str, Any]],
          min_effect_pct: float, alpha: float) -> tuple[list[Test], str]:
    """The tests and verdict of B against A from their metrics and the load generator's stored details
    (``farm.results.load_details``, one per repeat)."""
    tests = []
    wa = [t for d in det_a for t in window_values(d)]
    wb = [t for d in det_b for t in window_values(d)]
    ch = _change(sum(wa) / len(wa) if wa else None, sum(wb) / len(wb) if wb else None)
    if ch is not None and len(wa) >= 2 and len(wb) >= 2:
        p = welch_p(wa, wb)
        tests.append(Test("throughput_infer_per_s", ch, p, p < alpha and ch <= -min_effect_pct,
                          p < alpha and ch >= min_effect_pct))
    ha = [d["latency_histogram"] for d in det_a if (d.get("latency_histogram") or {}).get("count")]
    hb = [d["latency_histogram"] for d in det_b if (d.get("latency_histogram") or {}).get("count")]
    if ha and hb:
        ma, mb = merge_histograms(ha), merge_histograms(hb)
        ch = _change(histogram_quantile(ma, 50), histogram_quantile(mb, 50))
        if ch is not None:
            # requests of one run are not independent (a busy second slows all of its requests): the shift must
            # also show between the per-window p50s, the run's own record of its noise over time
            pa = [p for d in det_a for p in window_values(d, "p50_ms")]
            pb = [p for d in det_b for p in window_values(d, "p50_ms")]
            p = max(mann_whitney_hist(ma, mb), welch_p(pa, pb))
            tests.append(Test("latency_p50_ms", ch, p, p < alpha and ch >= min_effect_pct,
                              p < alpha and ch <= -min_effect_pct))
    if not tests:
        return tests, UNDECIDED
    if any(t.worse for t in tests):
        return tests, SLOWER
    return tests, FASTER if any(t.better for t in tests) else SAME


def _key(row: dict[str, Any], columns: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(row.get(c) for c in columns)


def _groups(rows: Iterable[dict[str, Any]], columns: tuple[str, ...]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(_key(r, columns), []).append(r)
    return out


def compare(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], details: dict[str, dict[str, Any]],
            ignore: tuple[str, ...] = (), min_effect_pct: float = 5.0, alpha: float = 0.01) -> Comparison:
    """Match ``rows_a`` and ``rows_b`` (``farm.results.result_rows``) by coordinates, minus ``ignore``;
    ``details``: stored details by job id. Repeats of one configuration on one side are pooled."""
    columns = tuple(c for c in CONFIG_COLUMNS if c not in ignore)
    ga, gb = _groups(rows_a, columns), _groups(rows_b, columns)
    out = Comparison(ignore, min_effect_pct, alpha)
    for key, group_a in ga.items():
        if key not in gb:
            out.only_a.extend(group_a)
            continue
        out.matches.append(_match(dict(zip(columns, key, strict=True)), group_a, gb[key], details,
                                  min_effect_pct, alpha))
    out.only_b = [r for key, group in gb.items() if key not in ga for r in group]
    return out


def host_marks(group_a: list[dict[str, Any]], group_b: list[dict[str, Any]]) -> list[str]:
    """The runs of a match whose host drifted or was busy beyond the bounds (``FARM_HOST_DRIFT_PCT``,
    ``FARM_HOST_BUSY_PCT``), each repeat judged on its own: ``A 1a2b3c drift -14%``, ``B 4d5e6f busy 38%``."""
    s = get_settings()
    return [f"{side} {r['job_id'][:6]} {flag}" for side, group in (("A", group_a), ("B", group_b)) for r in group
            for flag in host_flags(r, s.host_drift_pct, s.host_busy_pct)]


def _match(key: dict[str, Any], group_a: list[dict[str, Any]], group_b: list[dict[str, Any]],
           details: dict[str, dict[str, Any]], min_effect_pct: float, alpha: float) -> Match:
    """One matched configuration: merged metrics of each side, ratios B / A, tests, verdict and host flags."""
    flags = host_marks(group_a, group_b)
    ok_a = [r for r in group_a if r["status"] == JobStatus.succeeded]
    ok_b = [r for r in group_b if r["status"] == JobStatus.succeeded]
    a, b = merge_repeats(group_a)[0], merge_repeats(group_b)[0]
    ratios = {label: (None if a.get(m) in (None, 0) or b.get(m) is None else b[m] / a[m]) for m, label in RATIOS}
    if not ok_a or not ok_b:
        return Match(key, a, b, ratios, [], FAILED, 0.0, flags)
    tests, verdict = judge(a, b, [load_details(details.get(r["job_id"], {})) for r in ok_a],
                           [load_details(details.get(r["job_id"], {})) for r in ok_b], min_effect_pct, alpha)
    regression = max((abs(t.change_pct) for t in tests if t.worse), default=0.0)
    return Match(key, a, b, ratios, tests, verdict, regression, flags)


def as_json(c: Comparison, request_a: str, request_b: str) -> dict[str, Any]:
    """The comparison as ``farm compare --json`` prints it."""
    def short(r: dict[str, Any]) -> dict[str, Any]:
        return {k: r.get(k) for k in ("job_id", *CONFIG_COLUMNS, "status", "measured")}

    return {
        "a": request_a, "b": request_b, "ignore": list(c.ignore), "min_effect_pct": c.min_effect_pct,
        "alpha": c.alpha,
        "matches": [{"key": m.key, "measured": m.a.get("measured"), "a_job": m.a["job_id"], "b_job": m.b["job_id"],
                     "ratios": m.ratios, "verdict": m.verdict, "regression_pct": m.regression_pct, "flags": m.flags,
                     "tests": [t.__dict__ for t in m.tests],
                     "a": {n: m.a.get(n) for n in METRIC_NAMES}, "b": {n: m.b.get(n) for n in METRIC_NAMES}}
                    for m in c.matches],
        "only_in_a": [short(r) for r in c.only_a], "only_in_b": [short(r) for r in c.only_b],
    }

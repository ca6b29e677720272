"""Two requests compared configuration by configuration, judged on the variation between runs (``--repeats``).

Configurations match by their coordinates (``farm.readers.results.CONFIG_COLUMNS``, minus any the caller ignores,
e.g. ``engine`` to compare two engines). Each side of a match is the set of its succeeded runs (one per repeat).
The samples are one figure per run, the benchstat way: windows and requests inside one run share that run's
host state (a slow minute slows all of them), so only separate runs show what changes from run to run.

* **Test.** A two-sided Mann-Whitney U test (exact for small samples, scipy) between A's and B's per-run values
  of the verdict's metric: throughput (inferences/s) in closed loop and edge runs, the p50 latency in open loop
  (there the throughput is the offered rate); LLM rows: output tokens/s, and TTFT p50 in open loop. The other
  metric is tested too, as detail.
* **Change.** ``change_pct = 100 × (median of B's runs / median of A's runs − 1)`` (+ = B higher).
* **Verdict.** ``inconclusive`` when a side has fewer than :data:`MIN_REPEATS` runs, when the sample sizes
  cannot reach ``p < alpha`` at all (3 against 3 runs: the smallest two-sided p is 0.1), when any run of either
  side carries a host flag (:func:`host_marks`: the host's speed changed during the run beyond
  ``FARM_HOST_DRIFT_PCT``, or foreign load on its cores beyond ``FARM_HOST_BUSY_PCT``), or when a side did not
  succeed. Otherwise ``slower`` / ``faster`` when ``p < alpha``
  **and** the change is at least ``min_effect_pct`` in the worse / better direction; else ``same`` (no
  significant difference, or one smaller than ``min_effect_pct``).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from farm.readers.results import CONFIG_COLUMNS, METRIC_NAMES, llm_rows, merge_repeats
from farm.readers.rows import ResultRow, as_rows
from farm.settings import get_settings
from schemas.result import host_flags

SAME, FASTER, SLOWER, INCONCLUSIVE = "same", "faster", "slower", "inconclusive"
VERDICTS = (FASTER, SLOWER, SAME, INCONCLUSIVE)
#: fewest runs per side the verdict needs (``farm submit --repeats``)
MIN_REPEATS = 3
#: the tested metrics: (metric, higher is better)
TESTED = (("throughput_infer_per_s", True), ("latency_p50_ms", False))
#: the tested metrics of LLM rows (the OpenAI client's): generated tokens/s, then TTFT p50 (open loop: primary),
#: then ITL and TPOT p50 as detail (latencies: lower is better)
LLM_TESTED = (("output_tokens_per_s", True), ("ttft_p50_ms", False), ("itl_p50_ms", False), ("tpot_p50_ms", False))
#: the ratio columns of a comparison: (metric, label); B / A
RATIOS = (("throughput_infer_per_s", "throughput"), ("latency_p50_ms", "p50"), ("latency_p99_ms", "p99"),
          ("mem_peak_bytes", "memory"))
#: the same for LLM rows
LLM_RATIOS = (("output_tokens_per_s", "tok/s"), ("ttft_p50_ms", "TTFT"), ("itl_p50_ms", "ITL"),
              ("tpot_p50_ms", "TPOT"), ("mem_peak_bytes", "memory"))


def ratio_columns(rows: list[ResultRow]) -> tuple[tuple[str, str], ...]:
    """The ratio columns of a comparison of ``rows``: :data:`LLM_RATIOS` for LLM rows, else :data:`RATIOS`."""
    return LLM_RATIOS if llm_rows(rows) else RATIOS


@dataclass
class Test:
    """One metric's change B vs A over the runs: ``change_pct`` of the medians (+ = B higher), the Mann-Whitney
    p-value, whether B is worse/better (significant and at least the minimum effect), and whether the verdict
    rests on it (``primary``)."""

    metric: str
    change_pct: float
    p_value: float
    worse: bool
    better: bool
    primary: bool = False


@dataclass
class Match:
    """One configuration present in both requests: merged metrics (medians over runs), ratios B / A, tests,
    verdict and why (``reason``: empty for a conclusive verdict), runs per side."""

    key: dict[str, Any]
    a: ResultRow
    b: ResultRow
    ratios: dict[str, float | None]
    tests: list[Test]
    verdict: str
    regression_pct: float  # the primary metric's worsening in % when the verdict is slower (0 otherwise)
    reason: str = ""
    n_a: int = 0
    n_b: int = 0
    flags: list[str] = field(default_factory=list)  # runs whose host drifted or was busy (:func:`host_marks`)


@dataclass
class Comparison:
    ignore: tuple[str, ...]
    min_effect_pct: float
    alpha: float
    matches: list[Match] = field(default_factory=list)
    #: the ratio columns (:func:`ratio_columns`): (metric, label)
    ratios: tuple[tuple[str, str], ...] = RATIOS
    only_a: list[ResultRow] = field(default_factory=list)
    only_b: list[ResultRow] = field(default_factory=list)

    def regressions(self, pct: float) -> list[Match]:
        """The matches judged (conclusively) slower whose worsening is at least ``pct`` %."""
        return [m for m in self.matches if m.verdict == SLOWER and m.regression_pct >= pct]


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test between two samples (scipy's exact distribution for small
    samples without ties); 1.0 when either is empty.

    1.0 too, without asking scipy, where the test has nothing to test: every value of both samples equal (the
    tie-corrected variance of U is 0 and scipy's normal approximation divides by it, z = -0.5 / 0: the likely
    source of the RuntimeWarning issue 28 saw in ``farm compare``; scipy 1.17.1 here hides that division under
    ``np.errstate`` and the warning did not reproduce), or samples so small that no arrangement can reach a
    p-value under 1 (one run against one)."""
    if not a or not b or len(set(a) | set(b)) == 1 or smallest_p(len(a), len(b)) >= 1.0:
        return 1.0
    from scipy.stats import mannwhitneyu  # noqa: PLC0415 - scipy.stats costs ~2 s and ~70 MiB, only for a verdict

    p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p) else p


def smallest_p(n1: int, n2: int) -> float:
    """The smallest two-sided p-value the exact Mann-Whitney test can give for samples of ``n1`` and ``n2``:
    complete separation, 2 / C(n1 + n2, n1) (3 against 3 runs: 0.1; 4 against 4: 0.029; 5 against 5: 0.008)."""
    return min(1.0, 2.0 / math.comb(n1 + n2, n1))


def runs_needed(alpha: float) -> int:
    """The fewest runs per side (at least :data:`MIN_REPEATS`) with which the test can reach ``p < alpha``."""
    n = MIN_REPEATS
    while smallest_p(n, n) >= alpha and n < 50:
        n += 1
    return n


def host_marks(group_a: list[ResultRow], group_b: list[ResultRow]) -> list[str]:
    """The runs of a match whose host drifted or was busy beyond the bounds (``FARM_HOST_DRIFT_PCT``,
    ``FARM_HOST_BUSY_PCT``), each repeat judged on its own: ``A 1a2b3c drift -14%``, ``B 4d5e6f busy 38%``."""
    s = get_settings()
    return [f"{side} {str(r.get('job_id', ''))[:6]} {flag}" for side, group in (("A", group_a), ("B", group_b))
            for r in group for flag in host_flags(r, s.host_drift_pct, s.host_busy_pct)]


def _values(runs: list[ResultRow], metric: str) -> list[float]:
    return [float(r[metric]) for r in runs if r.get(metric) is not None]


def tested(runs: list[ResultRow]) -> tuple[tuple[str, bool], ...]:
    """The metrics a comparison of ``runs`` tests: :data:`LLM_TESTED` for LLM rows, else :data:`TESTED`."""
    return LLM_TESTED if llm_rows(runs) else TESTED


def run_tests(runs_a: list[ResultRow], runs_b: list[ResultRow], primary: str, min_effect_pct: float,
              alpha: float) -> list[Test]:
    """The Mann-Whitney tests of B's runs against A's, one per :func:`tested` metric both sides measured."""
    tests = []
    for metric, higher_better in tested(runs_a + runs_b):
        va, vb = _values(runs_a, metric), _values(runs_b, metric)
        if not va or not vb or statistics.median(va) == 0:
            continue
        change = 100.0 * (statistics.median(vb) / statistics.median(va) - 1.0)
        p = mann_whitney_p(va, vb)
        up, down = p < alpha and change >= min_effect_pct, p < alpha and change <= -min_effect_pct
        tests.append(Test(metric, change, p, worse=down if higher_better else up,
                          better=up if higher_better else down, primary=metric == primary))
    return tests


def judge(runs_a: list[ResultRow], runs_b: list[ResultRow], min_effect_pct: float,
          alpha: float) -> tuple[list[Test], str, str]:
    """The tests, verdict and its reason (empty when conclusive) of B's succeeded runs against A's (result rows,
    one per run)."""
    open_loop = any(r.get("rate") is not None for r in runs_a + runs_b)
    throughput, latency = (metric for metric, _ in tested(runs_a + runs_b)[:2])
    primary = latency if open_loop else throughput
    tests = run_tests(runs_a, runs_b, primary, min_effect_pct, alpha)
    n_a, n_b = len(_values(runs_a, primary)), len(_values(runs_b, primary))
    main = next((t for t in tests if t.primary), None)
    flags = host_marks(runs_a, runs_b)
    reason = ""
    if main is None:
        reason = f"no {primary} on a side"
    elif min(n_a, n_b) < MIN_REPEATS:
        reason = f"n={min(n_a, n_b)}: run with --repeats {runs_needed(alpha)} or more"
    elif smallest_p(n_a, n_b) >= alpha:
        reason = (f"n={n_a} vs {n_b}: the test cannot reach p < {alpha:g}; run with --repeats "
                  f"{runs_needed(alpha)} or more")
    elif flags:
        reason = "; ".join(flags)
    if reason or main is None:
        return tests, INCONCLUSIVE, reason
    return tests, SLOWER if main.worse else FASTER if main.better else SAME, ""


def _key(row: ResultRow, columns: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(row.get(c) for c in columns)


def _groups(rows: Iterable[ResultRow], columns: tuple[str, ...]) -> dict[tuple[Any, ...], list[ResultRow]]:
    out: dict[tuple[Any, ...], list[ResultRow]] = {}
    for r in rows:
        out.setdefault(_key(r, columns), []).append(r)
    return out


def compare(rows_a: list[ResultRow], rows_b: list[ResultRow], ignore: tuple[str, ...] = (),
            min_effect_pct: float = 5.0, alpha: float = 0.05) -> Comparison:
    """Match ``rows_a`` and ``rows_b`` (``farm.readers.results.result_rows``: one row per run) by coordinates, minus
    ``ignore``; the runs of one configuration on one side are its samples."""
    columns = tuple(c for c in CONFIG_COLUMNS if c not in ignore)
    ga, gb = _groups(as_rows(rows_a), columns), _groups(as_rows(rows_b), columns)
    out = Comparison(ignore, min_effect_pct, alpha, ratios=ratio_columns(rows_a + rows_b))
    for key, group_a in ga.items():
        if key not in gb:
            out.only_a.extend(group_a)
            continue
        out.matches.append(_match(dict(zip(columns, key, strict=True)), group_a, gb[key], min_effect_pct, alpha,
                                  out.ratios))
    out.only_b = [r for key, group in gb.items() if key not in ga for r in group]
    return out


def _match(key: dict[str, Any], group_a: list[ResultRow], group_b: list[ResultRow],
           min_effect_pct: float, alpha: float, columns: tuple[tuple[str, str], ...] = RATIOS) -> Match:
    """One matched configuration: merged metrics of each side (medians), ratios B / A, tests and verdict."""
    ok_a = [r for r in group_a if r.succeeded]
    ok_b = [r for r in group_b if r.succeeded]
    a, b = merge_repeats(group_a, center="median")[0], merge_repeats(group_b, center="median")[0]
    ratios = {label: (None if a.get(m) in (None, 0) or b.get(m) is None else b[m] / a[m]) for m, label in columns}
    if not ok_a or not ok_b:
        return Match(key, a, b, ratios, [], INCONCLUSIVE, 0.0, "a side did not succeed", len(ok_a), len(ok_b),
                     host_marks(group_a, group_b))
    tests, verdict, reason = judge(ok_a, ok_b, min_effect_pct, alpha)
    regression = next((abs(t.change_pct) for t in tests if t.primary), 0.0) if verdict == SLOWER else 0.0
    return Match(key, a, b, ratios, tests, verdict, regression, reason, len(ok_a), len(ok_b),
                 host_marks(ok_a, ok_b))


def as_json(c: Comparison, request_a: str, request_b: str) -> dict[str, Any]:
    """The comparison as ``farm compare --json`` prints it."""
    def short(r: ResultRow) -> dict[str, Any]:
        return {k: r.get(k) for k in ("job_id", *CONFIG_COLUMNS, "repeat", "status", "measured")}

    return {
        "a": request_a, "b": request_b, "ignore": list(c.ignore), "min_effect_pct": c.min_effect_pct,
        "alpha": c.alpha, "min_repeats": MIN_REPEATS,
        "matches": [{"key": m.key, "measured": m.a.get("measured"), "a_job": m.a["job_id"], "b_job": m.b["job_id"],
                     "n_a": m.n_a, "n_b": m.n_b, "ratios": m.ratios, "verdict": m.verdict, "reason": m.reason,
                     "regression_pct": m.regression_pct, "flags": m.flags, "tests": [t.__dict__ for t in m.tests],
                     "a": {n: m.a.get(n) for n in METRIC_NAMES}, "b": {n: m.b.get(n) for n in METRIC_NAMES}}
                    for m in c.matches],
        "only_in_a": [short(r) for r in c.only_a], "only_in_b": [short(r) for r in c.only_b],
    }

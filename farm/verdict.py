"""The verdict of an interleaved A/B comparison (``farm compare --interleaved``), from its per-pair ratios.

Each pair of blocks (one of A, one of B, measured back to back on the same cores) gives one ratio: NEW's cost over
OLD's (A's inferences/s over B's in a closed loop, B's p50 latency over A's in an open loop), so that above 1 means
NEW is slower. What the host did during the pair hits both blocks alike and cancels in the ratio; what is left is
the models' difference plus the noise within a block's fraction of a second. The verdict is taken on the median
of those ratios:

- a percentile bootstrap (seeded, so the same pairs always give the same verdict) gives its confidence interval;
- the interval is checked only at a few looks (:func:`looks`: after 10, 20, 40, ... pairs), each at ``alpha / looks``
  (Bonferroni over the looks the budget allows), so stopping early at the first conclusive look keeps the chance of
  a wrong verdict within ``alpha``;
- ``slower`` / ``faster``: the interval excludes no change, the sign test (exact binomial, two-sided) rejects no
  change at the same level, and the median change is at least ``min_effect`` %. The sign test is exact at any
  number of pairs, where a percentile bootstrap of a median over 10 pairs covers less than it says;
  ``same``: the interval lies within +-``min_effect`` %; ``inconclusive`` otherwise;
- the minimum detectable difference: the change (%) the test would find 80 % of the time at this many pairs and
  this spread, ``(z(1 - a/2) + z(0.8)) x`` the bootstrap's standard error of the median change.

Own code rather than scipy (not a dependency of farm): a bootstrap and a binomial tail are a few lines
of NumPy and ``math.comb``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

SLOWER, FASTER, SAME, INCONCLUSIVE = "slower", "faster", "same", "inconclusive"
#: the pair counts at which the verdict is checked (then every doubling)
FIRST_LOOK = 10
#: bootstrap resamples
RESAMPLES = 4000
#: the power the minimum detectable difference is quoted at
POWER = 0.8


def looks(max_pairs: int) -> list[int]:
    """The pair counts the verdict is checked at, up to ``max_pairs``: 10, 20, 40, ... (and ``max_pairs``)."""
    out, n = [], FIRST_LOOK
    while n < max_pairs:
        out.append(n)
        n *= 2
    return out + [max(max_pairs, 1)]


@dataclass(frozen=True)
class Verdict:
    """The verdict over ``pairs`` ratios: ``change_pct`` (NEW against OLD, the median ratio - 1, %: above 0 is
    slower), its confidence interval ``ci_pct`` at ``level``, the ``detectable_pct`` (see the module), the sign
    test's ``p_sign`` and how many pairs had NEW slower, and ``verdict``."""

    verdict: str
    pairs: int
    change_pct: float
    ci_pct: tuple[float, float]
    level: float
    detectable_pct: float
    slower_pairs: int
    p_sign: float
    min_effect_pct: float

    @property
    def conclusive(self) -> bool:
        return self.verdict != INCONCLUSIVE

    def regression(self, pct: float) -> bool:
        """Whether this is a conclusive slowdown of ``pct`` % or more."""
        return self.verdict == SLOWER and self.change_pct >= pct

    def as_dict(self) -> dict[str, object]:
        return {"verdict": self.verdict, "pairs": self.pairs, "change_pct": self.change_pct,
                "ci_pct": list(self.ci_pct), "ci_level": self.level, "detectable_pct": self.detectable_pct,
                "slower_pairs": self.slower_pairs, "p_sign": self.p_sign, "min_effect_pct": self.min_effect_pct}


def cost_ratios(a: Sequence[float | None], b: Sequence[float | None], higher_is_better: bool) -> list[float]:
    """Per pair, NEW's cost over OLD's (above 1: NEW slower); pairs with a missing or zero figure are left out."""
    out = []
    for x, y in zip(a, b, strict=True):
        if not x or not y:
            continue
        out.append(x / y if higher_is_better else y / x)
    return out


def sign_test(k: int, n: int) -> float:
    """Two-sided exact binomial p-value of ``k`` successes in ``n`` at one half."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def judge(ratios: Sequence[float], alpha: float = 0.05, min_effect_pct: float = 2.0, n_looks: int = 1,
          seed: int = 0) -> Verdict:
    """The verdict over ``ratios`` (:func:`cost_ratios`) at ``alpha`` shared among ``n_looks`` looks."""
    n = len(ratios)
    level = 1.0 - alpha / max(1, n_looks)
    if n < 2:
        return Verdict(INCONCLUSIVE, n, math.nan, (math.nan, math.nan), level, math.inf, 0, 1.0, min_effect_pct)
    logs = np.log(np.asarray(ratios, dtype=float))
    rng = np.random.default_rng(seed)
    boot = np.median(logs[rng.integers(0, n, size=(RESAMPLES, n))], axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = (float(np.expm1(v)) * 100.0 for v in np.quantile(boot, [tail, 1.0 - tail]))
    change = float(np.expm1(np.median(logs))) * 100.0
    z = NormalDist().inv_cdf(1.0 - tail) + NormalDist().inv_cdf(POWER)
    detectable = float(np.expm1(z * np.std(boot))) * 100.0
    slower = int(np.sum(logs > 0))
    ties = int(np.sum(logs == 0))
    p_sign = sign_test(slower, n - ties)
    return Verdict(_call(lo, hi, change, min_effect_pct, p_sign < 1.0 - level), n, change, (lo, hi), level,
                   detectable, slower, p_sign, min_effect_pct)


def _call(lo: float, hi: float, change: float, min_effect: float, signed: bool) -> str:
    """The verdict of a confidence interval [lo, hi] and median ``change`` (all %); ``signed``: the sign test
    rejects no change at the same level (exact, so a few pairs cannot conclude on the bootstrap alone)."""
    if lo > 0 and change >= min_effect and signed:
        return SLOWER
    if hi < 0 and change <= -min_effect and signed:
        return FASTER
    if -min_effect < lo and hi < min_effect:
        return SAME
    return INCONCLUSIVE


def line_up(x: Sequence[float], y: Sequence[float], alpha: float = 0.05, min_effect_pct: float = 2.0,
            seed: int = 0) -> Verdict:
    """Two hosts' figures lined up: ``x`` and ``y`` are one model's per-pair cost ratios against the same reference
    on host X and host Y (``farm.host_figure``); the verdict is on Y's median over X's (above 0 %: the model costs
    more reference units on Y). The samples are independent, so: a bootstrap of each median resampled apart, and a
    rank-sum test (Mann-Whitney U, normal approximation with a tie correction) in place of the sign test;
    ``slower_pairs``: Y's ratios above X's median."""
    nx, ny = len(x), len(y)
    level = 1.0 - alpha
    if min(nx, ny) < 2:
        return Verdict(INCONCLUSIVE, min(nx, ny), math.nan, (math.nan, math.nan), level, math.inf, 0, 1.0,
                       min_effect_pct)
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    rng = np.random.default_rng(seed)
    boot = (np.median(ly[rng.integers(0, ny, size=(RESAMPLES, ny))], axis=1)
            - np.median(lx[rng.integers(0, nx, size=(RESAMPLES, nx))], axis=1))
    tail = alpha / 2.0
    lo, hi = (float(np.expm1(v)) * 100.0 for v in np.quantile(boot, [tail, 1.0 - tail]))
    change = float(np.expm1(np.median(ly) - np.median(lx))) * 100.0
    z = NormalDist().inv_cdf(1.0 - tail) + NormalDist().inv_cdf(POWER)
    p = rank_sum_p(lx, ly)
    return Verdict(_call(lo, hi, change, min_effect_pct, p < alpha), min(nx, ny), change, (lo, hi), level,
                   float(np.expm1(z * np.std(boot))) * 100.0, int(np.sum(ly > np.median(lx))), p, min_effect_pct)


def rank_sum_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test of ``x`` against ``y`` (normal approximation, ties corrected)."""
    nx, ny = len(x), len(y)
    both = np.concatenate([x, y])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(len(both))
    ranks[order] = np.arange(1, len(both) + 1)
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    ranks = np.bincount(inverse, weights=ranks)[inverse] / counts[inverse]  # ties: their mean rank
    u = float(ranks[:nx].sum()) - nx * (nx + 1) / 2.0
    n = nx + ny
    var = nx * ny / 12.0 * ((n + 1) - float(np.sum(counts ** 3 - counts)) / (n * (n - 1)))
    if var <= 0:
        return 1.0
    zscore = (abs(u - nx * ny / 2.0) - 0.5) / math.sqrt(var)
    return min(1.0, 2.0 * (1.0 - NormalDist().cdf(max(0.0, zscore))))

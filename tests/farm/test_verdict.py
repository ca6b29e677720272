"""The interleaved comparison's statistics (``farm.verdict``) on synthetic per-pair ratios: no host, no timing."""
from __future__ import annotations

import math

import numpy as np
import pytest

from farm.verdict import (
    FASTER,
    INCONCLUSIVE,
    SAME,
    SLOWER,
    cost_ratios,
    judge,
    line_up,
    looks,
    rank_sum_p,
    sign_test,
)


def ratios(change: float, spread: float, n: int, seed: int) -> list[float]:
    """``n`` pair ratios around ``1 + change`` with a log-normal ``spread`` and a few host outliers."""
    rng = np.random.default_rng(seed)
    logs = math.log1p(change) + rng.normal(0.0, spread, n)
    hit = rng.random(n) < 0.1  # a pair split by a host step, on either side: the median ignores it
    logs[hit] += rng.choice([-0.5, 0.5], size=int(hit.sum()))
    return [float(x) for x in np.exp(logs)]


def test_a_against_a_is_rarely_called_slower_or_faster() -> None:
    verdicts = [judge(ratios(0.0, 0.08, 40, seed), n_looks=3).verdict for seed in range(40)]
    assert sum(v in (SLOWER, FASTER) for v in verdicts) <= 2, verdicts  # alpha 5 %: at most 2 of 40


def test_a_quiet_a_against_a_is_the_same() -> None:
    v = judge(ratios(0.0, 0.01, 40, 1))
    assert v.verdict == SAME and v.ci_pct[0] < 0 < v.ci_pct[1] and v.detectable_pct < 2.0


def test_a_clear_slowdown_is_found_with_its_interval() -> None:
    for seed in range(20):
        v = judge(ratios(0.20, 0.08, 20, seed), n_looks=3)
        assert v.verdict == SLOWER, (seed, v)
        assert v.ci_pct[0] < v.change_pct < v.ci_pct[1] and v.ci_pct[0] > 0
        assert 10.0 < v.change_pct < 30.0 and v.regression(10.0) and not v.regression(40.0)


def test_a_speedup_is_faster_and_never_a_regression() -> None:
    v = judge(ratios(-0.20, 0.05, 20, 3))
    assert v.verdict == FASTER and v.change_pct < 0 and not v.regression(0.0)


def test_a_slowdown_within_the_noise_is_inconclusive_and_says_what_it_could_detect() -> None:
    v = judge(ratios(0.03, 0.3, 10, 4), n_looks=3)
    assert v.verdict == INCONCLUSIVE and v.detectable_pct > 10.0 and not v.regression(0.0)


def test_more_pairs_detect_smaller_differences() -> None:
    few, many = judge(ratios(0.0, 0.1, 10, 5)), judge(ratios(0.0, 0.1, 160, 5))
    assert many.detectable_pct < few.detectable_pct


def test_the_same_pairs_give_the_same_verdict() -> None:
    data = ratios(0.05, 0.1, 30, 6)
    assert judge(data, seed=2) == judge(data, seed=2)


def test_too_few_pairs_are_inconclusive() -> None:
    assert judge([1.5]).verdict == INCONCLUSIVE and judge([]).pairs == 0


def test_more_looks_widen_the_interval() -> None:
    data = ratios(0.05, 0.1, 30, 7)
    one, five = judge(data, n_looks=1), judge(data, n_looks=5)
    assert five.level > one.level and five.ci_pct[1] - five.ci_pct[0] > one.ci_pct[1] - one.ci_pct[0]


@pytest.mark.parametrize(("a", "b", "higher", "want"), [
    ([100.0, 50.0], [80.0, 50.0], True, [1.25, 1.0]),  # throughput: NEW does 80/s where OLD did 100/s
    ([2.0, 4.0], [3.0, 4.0], False, [1.5, 1.0]),  # latency: NEW takes 3 ms where OLD took 2
    ([100.0, None, 0.0], [80.0, 50.0, 1.0], True, [1.25]),  # a block without a figure leaves its pair out
])
def test_cost_ratios_are_new_over_old_cost(a: list[float | None], b: list[float | None], higher: bool,
                                           want: list[float]) -> None:
    assert cost_ratios(a, b, higher) == pytest.approx(want)


def test_sign_test_and_looks() -> None:
    assert sign_test(0, 10) == pytest.approx(2 / 1024) and sign_test(5, 10) == 1.0 and sign_test(0, 0) == 1.0
    assert looks(100) == [10, 20, 40, 80, 100] and looks(10) == [10] and looks(5) == [5]


def test_a_few_pairs_conclude_only_when_the_exact_sign_test_agrees() -> None:
    data = [1.2] * 9 + [0.9]  # 9 of 10 slower: the bootstrap's interval excludes 0, the sign test's p is 0.021
    strict = judge(data, n_looks=5)  # each look at 0.01
    assert strict.ci_pct[0] > 0 and strict.p_sign > 0.01 and strict.verdict == INCONCLUSIVE
    assert judge(data, n_looks=1).verdict == SLOWER  # at 0.05 both agree


def test_line_up_finds_a_shift_between_two_hosts_and_not_a_common_one() -> None:
    rng = np.random.default_rng(3)
    x = list(np.exp(rng.normal(0.0, 0.02, 40)))
    same = list(np.exp(rng.normal(0.0, 0.02, 40)))
    shifted = list(np.exp(rng.normal(np.log(1.10), 0.02, 40)))
    assert line_up(x, same).verdict == "same"
    up = line_up(x, shifted)
    assert up.verdict == "slower" and 8.0 < up.change_pct < 12.0 and up.ci_pct[0] > 0 and up.p_sign < 0.001
    assert line_up(shifted, x).verdict == "faster"
    assert line_up([1.0], x).verdict == "inconclusive"
    # Mann-Whitney: no overlap in 3 + 3 gives U = 0, the normal approximation's p about 0.08 (continuity corrected)
    assert rank_sum_p(np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])) == pytest.approx(0.0809, abs=0.001)
    assert rank_sum_p(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 1.0

"""farm.readers.knee: the knee of output tokens/s against concurrency, by the documented gain-per-doubling rule."""
from __future__ import annotations

import pytest

from farm.readers.knee import Knee, find_knee, gain_per_doubling_pct, knees


def test_the_knee_is_the_last_point_before_a_doubling_gains_under_ten_percent() -> None:
    # doubling 1->2->4->8 gains 90 %, 80 %, 40 %; 8->16 gains 5 %: the knee is c=8
    pts = [(1, 100.0), (2, 190.0), (4, 342.0), (8, 479.0), (16, 503.0), (32, 505.0)]
    k = find_knee(pts)
    assert k == Knee(8, 479.0, pytest.approx(5.01, abs=0.01), True, 6)
    assert k is not None and k.text() == "knee at c=8: 479 tok/s"


def test_a_step_over_two_doublings_is_judged_per_doubling() -> None:
    assert gain_per_doubling_pct(4, 100.0, 16, 121.0) == pytest.approx(10.0)  # 21 % over two doublings
    assert find_knee([(4, 100.0), (16, 121.0)], min_gain_pct=10.0) is not None
    assert find_knee([(4, 100.0), (16, 120.0)], min_gain_pct=10.0).concurrency == 4  # type: ignore[union-attr]


def test_a_curve_still_climbing_at_its_end_says_so_and_a_falling_one_stops_at_its_peak() -> None:
    climbing = find_knee([(1, 100.0), (2, 180.0), (4, 300.0)])
    assert climbing is not None and climbing.concurrency == 4 and not climbing.saturated
    assert "sweep higher" in climbing.text()
    falling = find_knee([(1, 100.0), (2, 150.0), (4, 120.0)])
    assert falling is not None and (falling.concurrency, falling.next_gain_pct) == (2, pytest.approx(-20.0))


def test_too_few_points_have_no_knee_and_repeats_at_one_concurrency_are_averaged() -> None:
    assert find_knee([(1, 100.0)]) is None and find_knee([]) is None
    assert find_knee([(1, 100.0), (1, 0.0), (0, 50.0)]) is None  # a zero rate and c=0 are left out
    k = find_knee([(1, 90.0), (1, 110.0), (2, 104.0)])
    assert k is not None and (k.concurrency, k.tokens_per_s) == (1, 100.0)


def test_knees_per_sweep_leave_out_open_loop_and_failed_rows() -> None:
    def row(c: int, tps: float, knobs: str | None = None, **kw: object) -> dict[str, object]:
        return {"device": "cpu", "engine": "llama.cpp", "batch_size": 1, "knob_set": knobs, "edge_profile": None,
                "concurrency": c, "rate": None, "status": "succeeded", "output_tokens_per_s": tps, **kw}

    rows = [row(1, 100), row(2, 190), row(4, 200), row(1, 100, "n_parallel=4"), row(2, 200, "n_parallel=4"),
            row(4, 390, "n_parallel=4"), row(8, 400, "n_parallel=4"), row(8, 9999, status="failed"),
            row(8, 9999, rate=5.0)]
    got = dict(knees(rows))
    assert got["cpu llama.cpp"].concurrency == 2
    assert got["cpu llama.cpp n_parallel=4"].concurrency == 4

"""The max-goodput search's pure rule (``scheduler.goodput_rules``): doubling, halving, bisecting to 5 %, the
step cap, over-saturated and failed steps, and how many steps it needs against a known capacity."""
from __future__ import annotations

import pytest

from scheduler.expand import ModelRef, expand, job_count
from scheduler.goodput_rules import (
    BRACKET,
    MAX_STEP_S,
    MAX_STEPS,
    MIN_STEP_REQUESTS,
    RateStep,
    decide_rate,
    max_steps_for,
    round_rate,
    step_duration,
)
from schemas import ProfileRequest


def _run(start: float, passes: object, cap: int = MAX_STEPS) -> tuple[list[float], float | None]:
    """Drive the rule to its end with ``passes(rate) -> share``; the rates measured and the answer."""
    steps: list[RateStep] = []
    while (d := decide_rate(start, steps, cap)).next is not None:
        steps.append(RateStep(d.next, passes(d.next)))  # type: ignore[operator]
    return [s.rate for s in steps], d.best.rate if d.best else None


def test_first_step_is_the_start_rate_rounded() -> None:
    d = decide_rate(3.14159, [])
    assert d.next == 3.14 and d.best is None and not d.done


def test_doubles_while_passing_then_bisects_to_the_bracket() -> None:
    rates, answer = _run(4, lambda r: 1.0 if r <= 37 else 0.5)
    assert rates[:5] == [4, 8, 16, 32, 64]  # doubling up to the first failure
    assert rates[5] == 48  # then the midpoint of 32..64
    assert answer is not None and answer <= 37 < answer * (1 + BRACKET) + 1e-9 * answer
    assert len(rates) <= MAX_STEPS


def test_halves_while_failing() -> None:
    rates, answer = _run(64, lambda r: 1.0 if r <= 5 else 0.0)
    assert rates[:5] == [64, 32, 16, 8, 4]
    assert answer is not None and answer <= 5 and 5 <= answer * (1 + BRACKET) * 1.01


def test_the_95_percent_rule_and_what_fails_a_step() -> None:
    assert RateStep(10, 0.95).passed and not RateStep(10, 0.949).passed
    assert not RateStep(10, 1.0, oversaturated=True).passed  # an over-saturated step fails whatever its share
    assert not RateStep(10, None).passed  # a failed job
    d = decide_rate(10, [RateStep(10, 1.0), RateStep(20, 1.0, oversaturated=True)])
    assert d.next == 15 and "bisecting 10..20" in d.reason and d.ceiling == 20
    d = decide_rate(10, [RateStep(10, 1.0), RateStep(20, None)])
    assert d.next == 15


def test_done_within_the_bracket_names_the_answer_and_why_above_fails() -> None:
    d = decide_rate(10, [RateStep(10, 1.0), RateStep(10.4, 0.8)])
    assert d.done and d.best == RateStep(10, 1.0) and d.ceiling == 10.4
    assert "max goodput rate 10 req/s" in d.reason and "80% within the SLO" in d.reason
    d = decide_rate(10, [RateStep(10, 1.0), RateStep(10.4, 0.99, oversaturated=True)])
    assert d.done and "over-saturated" in d.reason


def test_a_pass_above_a_failure_does_not_move_the_ceiling() -> None:
    # noise near the edge: 30 failed, 40 passed; the bracket stays below the lowest failure
    d = decide_rate(10, [RateStep(10, 1.0), RateStep(20, 1.0), RateStep(40, 0.97), RateStep(30, 0.5)])
    assert d.ceiling == 30 and d.best is not None and d.best.rate == 20 and d.next == 25


def test_step_cap_stops_with_the_best_so_far() -> None:
    rates, answer = _run(1, lambda r: 1.0 if r <= 1000 else 0.0, cap=4)
    assert rates == [1, 2, 4, 8] and answer == 8
    d = decide_rate(1, [RateStep(r, 1.0) for r in rates], max_steps=4)
    assert d.done and "cap of 4 steps" in d.reason


def test_nothing_passes_down_to_the_floor() -> None:
    rates, answer = _run(1, lambda r: 0.0)
    assert answer is None and rates[-1] >= 0.01 and len(rates) <= MAX_STEPS
    d = decide_rate(1, [RateStep(r, 0.0) for r in rates])
    assert d.done and ("no rate" in d.reason)


@pytest.mark.parametrize("value,expect", [(12.3456, 12.3), (0.012345, 0.0123), (1234.5, 1230.0), (48.0, 48.0)])
def test_round_rate_three_significant_digits(value: float, expect: float) -> None:
    assert round_rate(value) == expect


@pytest.mark.parametrize("capacity", [3.3, 17.0, 37.0, 120.0, 900.0])
def test_steps_needed_stay_a_third_of_a_fine_grid(capacity: float) -> None:
    """Against a sharp capacity, from 1 req/s: found within 5 % in far fewer steps than a 5 % grid up to 2x
    the capacity takes (what ``benchmarks/llm_goodput_search.py`` measures with a real server)."""
    n = max_steps_for(1.0, capacity)
    grid = 0
    r = 1.0
    while r <= 2 * capacity:
        grid += 1
        r *= 1 + BRACKET
    rates, answer = _run(1.0, lambda x: 1.0 if x <= capacity else 0.0)
    assert answer is not None and capacity / (1 + BRACKET) <= answer * 1.01 and answer <= capacity
    assert n == len(rates) and n <= MAX_STEPS and n * 3 <= grid


def test_expansion_submits_one_first_step_per_configuration_at_the_rounded_start() -> None:
    req = ProfileRequest.model_validate({"model": "m.gguf", "format": "gguf", "rates": [3.33333],
                                         "knobs": {"n_ctx": [512, 2048]},
                                         "measurement": {"search": "max-goodput", "llm": {"slo": "ttft=500"}}})
    model = ModelRef(sha256="a" * 64, format="gguf", filename="m.gguf", inputs=())
    jobs = expand(req, "r", model).jobs
    assert job_count(req, model) == len(jobs) == 2 and len({j.job_id for j in jobs}) == 2
    assert {(j.rate, j.measurement.mode) for j in jobs} == {(3.33, "poisson")}
    assert {j.measurement.duration_s for j in jobs} == {None}  # 10 s of windows: 33 requests expected
    short = ProfileRequest.model_validate({**req.model_dump(exclude_unset=True), "rates": [1.0],
                                           "measurement": {**req.measurement.model_dump(exclude_unset=True),
                                                           "rate": 1.0, "duration_s": 2.0}})
    assert {j.measurement.duration_s for j in expand(short, "r", model).jobs} == {MIN_STEP_REQUESTS / 1.0}


def test_a_low_rate_step_is_lengthened_to_expect_enough_requests() -> None:
    assert step_duration(2.0, 10.0, 50.0) == 2.0  # 100 requests expected: as asked
    assert step_duration(None, 10.0, 5.0) is None  # its windows: 50 requests
    assert step_duration(2.0, 10.0, 1.0) == MIN_STEP_REQUESTS / 1.0  # 2 requests expected: 20 s
    assert step_duration(None, 10.0, 0.01) == MAX_STEP_S  # capped

"""Quick-search decisions on synthetic result sequences: where each search stops and what it picks."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from farm import lifecycle
from farm.cli.hooks import register_hooks
from farm.hooks import search_step_done
from scheduler.search import advance
from scheduler.search_rules import GAIN, Decision, Step, decide, first_level

LEVELS = [1, 2, 4, 8, 16, 32, 64, 128]


def run(levels: Sequence[float], measure: Callable[[Any], Step], p99_ms: float | None = None,
        load: str = "concurrency") -> tuple[Decision, list[float]]:
    """Drive a search to its end the way the scheduler does: one step at a time, results as they land."""
    steps: list[Step] = []
    while True:
        d = decide(levels, steps, p99_ms, load)
        if d.done:
            return d, [s.level for s in steps]
        assert d.next not in [s.level for s in steps], "a search never measures a step twice"
        steps.append(measure(d.next))


def saturating(knee: int, peak: float = 1000.0, base_ms: float = 2.0) -> Callable[[int], Step]:
    """Throughput grows linearly up to ``knee``, then flat; latency flat then growing with queueing."""
    def measure(c: int) -> Step:
        tput = peak * min(c, knee) / knee
        return Step(c, tput, base_ms * max(1.0, c / knee))
    return measure


def test_climb_stops_when_throughput_gains_under_5_percent_over_two_steps() -> None:
    d, measured = run(LEVELS, saturating(knee=8))
    assert measured == [1, 2, 4, 8, 16, 32]  # 32 is no better than 8: stop
    assert d.best is not None and d.best.level == 8 and "under 5%" in d.reason


def test_climb_keeps_going_while_gains_exceed_the_threshold() -> None:
    d, measured = run(LEVELS, lambda c: Step(c, 100.0 * c ** 0.5))  # +41 % per doubling: never stops early
    assert measured == LEVELS and d.best is not None and d.best.level == 128 and "end of" in d.reason


@pytest.mark.parametrize("eps,stop_at", [(-1e-6, 16), (1e-6, 32)])
def test_gain_threshold_over_the_last_two_steps(eps: float, stop_at: int) -> None:
    """The gain of the newest step over the one two steps before it decides (300 at c=4 -> 315 = +5 %)."""
    tputs = {1: 100.0, 2: 200.0, 4: 300.0, 8: 310.0, 16: 300.0 * (1 + GAIN) + eps, 32: 316.0, 64: 317.0}
    d, measured = run([1, 2, 4, 8, 16, 32, 64], lambda c: Step(c, tputs[c]))
    assert measured[-1] == stop_at and d.done


def test_climb_stops_at_a_failed_step() -> None:
    d, measured = run(LEVELS, lambda c: Step(c, None if c == 4 else 10.0 * c))
    assert measured == [1, 2, 4] and d.best is not None and d.best.level == 2 and "failed" in d.reason


def rising(knee: float, peak: float = 1000.0, base_ms: float = 2.0) -> Callable[[int], Step]:
    """Throughput rising with diminishing returns, p99 rising with queueing (both strictly)."""
    return lambda c: Step(c, peak * c / (c + knee), base_ms * (1 + c / knee))


@pytest.mark.parametrize("budget", [2.5, 4.0, 9.0, 20.0, 100.0])
def test_bisection_matches_brute_force_with_a_third_of_the_steps(budget: float) -> None:
    levels = list(range(1, 65))
    curve = rising(knee=8)
    d, measured = run(levels, curve, p99_ms=budget)
    within = [curve(c) for c in levels if (curve(c).p99_ms or 0) <= budget]
    brute = max(within, key=lambda s: s.throughput or 0)
    assert d.best == brute and d.best.p99_ms is not None and d.best.p99_ms <= budget
    assert len(measured) <= 7 and len(measured) <= len(levels) / 3  # ceil(log2(64 + 1))


def test_bisection_picks_the_best_throughput_among_steps_within_budget() -> None:
    """A flat throughput after the knee: the pick is the best throughput, its lowest concurrency."""
    d, measured = run(LEVELS, saturating(knee=8), p99_ms=4.0)
    assert d.best is not None and d.best.throughput == 1000.0 and d.best.level == 8
    assert 16 in measured and "highest concurrency within p99 4 ms is c=16" in d.reason


def test_bisection_when_even_the_lowest_concurrency_is_over_budget() -> None:
    d, measured = run(LEVELS, saturating(knee=8, base_ms=5.0), p99_ms=1.0)
    assert d.best is None and measured[-1] == 1 and "already exceeds" in d.reason


def test_bisection_treats_a_failed_step_as_over_budget() -> None:
    d, _ = run(LEVELS, lambda c: Step(c, None if c >= 32 else 10.0 * c, 1.0), p99_ms=10.0)
    assert d.best is not None and d.best.level == 16


def test_first_steps_and_results_in_any_order() -> None:
    assert first_level(LEVELS, None) == 1
    assert first_level(LEVELS, 5.0) == 8  # the middle of 8 levels
    m = saturating(knee=8)
    shuffled = [m(64), m(1), m(16), m(4)]
    assert decide(LEVELS, shuffled, 3.0) == decide(LEVELS, list(reversed(shuffled)), 3.0)
    assert decide(LEVELS, [m(1), m(2)], None).next == 4


@pytest.fixture
def search_hook() -> Iterator[None]:
    """What ``farm worker`` and embedded runs do at start-up: register the scheduler's ``advance`` for the event a
    worker's ledger raises when a search step's result is written (``farm.hooks``); unregistered after the test."""
    register_hooks()
    yield
    search_step_done.unregister(advance)


def test_the_worker_raises_an_event_that_the_cli_wires_to_the_scheduler(sqlite_url: str, example_onnx: Path) -> None:
    """Workers never import the scheduler: a result written through the worker's ledger adds the next step only
    once the CLI's handler is registered (reconciliation would add it otherwise); registering twice is once."""
    from farm.db.session import session_scope
    from scheduler.enqueue import submit
    from schemas import JobResult, ProfileRequest
    from workers import ledger

    sub = submit(ProfileRequest(model=str(example_onnx), concurrency=[1, 2, 4], measurement={"search": "quick"}),
                 send=False)
    (job,) = sub.expansion.jobs
    spec = ledger.claim(job.job_id, "w1")
    assert spec is not None and ledger.start(job.job_id, "w1")
    assert search_step_done.handlers == ()
    assert ledger.finish(spec, "w1", JobResult(job_id=job.job_id, metrics={"throughput_infer_per_s": 100.0}))
    with session_scope() as s:
        assert lifecycle.resumable(s, sub.request_id) == []  # no handler: no step yet
    try:
        register_hooks()
        register_hooks()
        assert search_step_done.handlers == (advance,)
        search_step_done.fire(sub.request_id)
    finally:
        search_step_done.unregister(advance)
    with session_scope() as s:
        assert len(lifecycle.resumable(s, sub.request_id)) == 1


@pytest.mark.usefixtures("search_hook")
def test_the_scheduler_adds_each_next_step_once_as_results_land(sqlite_url: str, example_onnx: Path) -> None:
    """Against a real (SQLite) ledger: each result written through the worker's ledger enqueues the next
    step; asking again adds nothing; the search ends where ``decide`` says, with a report for ``farm status``."""
    from farm.db.session import session_scope
    from scheduler.enqueue import submit
    from scheduler.search import next_steps, search_report
    from schemas import JobResult, ProfileRequest
    from workers import ledger

    curve = saturating(knee=2)
    sub = submit(ProfileRequest(model=str(example_onnx), concurrency=[1, 2, 4, 8, 16, 32], instances=[1, 2],
                                measurement={"search": "quick"}), send=False)
    rid, ran = sub.request_id, []
    todo = [j.job_id for j in sub.expansion.jobs]
    while todo:
        job_id = todo.pop(0)
        spec = ledger.claim(job_id, "w1")
        assert spec is not None and ledger.start(job_id, "w1")
        step = curve(spec.concurrency)
        metrics = {"throughput_infer_per_s": (step.throughput or 0) * spec.measurement.instances,
                   "latency_p99_ms": step.p99_ms}
        assert ledger.finish(spec, "w1", JobResult(job_id=job_id, metrics=metrics))
        ran.append((spec.measurement.instances, spec.concurrency))
        with session_scope() as s:
            assert next_steps(s, rid) == []  # the finish already added the next step; nothing twice
            todo += [j for j, _ in lifecycle.resumable(s, rid) if j not in todo]
    assert sorted(ran) == [(i, c) for i in (1, 2) for c in (1, 2, 4, 8)]  # flat from 2: stops at 8
    report = search_report(rid)
    assert sorted(r["config"]["instances"] for r in report) == [1, 2]
    assert all(r["done"] and r["best"]["concurrency"] == 2 for r in report)


def _finish_without_hook(job_id: str, throughput: float, p99: float) -> None:
    """Claim, start and finish a job through ``farm.lifecycle`` only, as a worker that died right after
    writing its result would leave it (no next step enqueued)."""
    from farm.db.session import session_scope
    from schemas import JobResult

    with session_scope() as s:
        spec = lifecycle.claim(s, job_id, "w1")
        assert spec is not None and lifecycle.start(s, job_id, "w1")
        assert lifecycle.finish(s, spec, "w1", JobResult(job_id=job_id, metrics={
            "throughput_infer_per_s": throughput, "latency_p99_ms": p99}))


def test_reconciliation_advances_a_search_whose_worker_died_after_its_result(sqlite_url: str,
                                                                              example_onnx: Path) -> None:
    from farm.db.session import session_scope
    from scheduler.enqueue import submit
    from scheduler.reconcile import reconcile
    from schemas import ProfileRequest

    sub = submit(ProfileRequest(model=str(example_onnx), concurrency=[1, 2, 4], measurement={"search": "quick"}),
                 send=False)
    brute = submit(ProfileRequest(model=str(example_onnx), concurrency=[1, 2]), send=False)
    _finish_without_hook(sub.expansion.jobs[0].job_id, 100.0, 1.0)
    _finish_without_hook(brute.expansion.jobs[0].job_id, 100.0, 1.0)
    report = reconcile()
    with session_scope() as s:
        queued = lifecycle.resumable(s, sub.request_id)
        assert len(lifecycle.resumable(s, brute.request_id)) == 1  # brute force: nothing added
    assert [j for j, _ in queued] == report.search_steps and len(queued) == 1
    assert reconcile().search_steps == []  # the step is there: nothing twice


def test_a_cancelled_search_adds_no_step(sqlite_url: str, example_onnx: Path) -> None:
    from farm.db.session import session_scope
    from scheduler.enqueue import submit
    from scheduler.search import next_steps, search_report
    from schemas import ProfileRequest

    sub = submit(ProfileRequest(model=str(example_onnx), concurrency=[1, 2, 4, 8, 16, 32, 64],
                                measurement={"search": "quick", "p99_ms": 5}), send=False)
    with session_scope() as s:
        lifecycle.cancel(s, sub.request_id, "cancelled by `farm cancel`")
        assert next_steps(s, sub.request_id) == []
    (report,) = search_report(sub.request_id)
    assert report["done"] and "cancelled" in report["state"]


def test_a_single_serving_value_in_a_request_file_is_a_list_of_one() -> None:
    from schemas import ProfileRequest

    req = ProfileRequest.model_validate({"model": "m.onnx", "instances": 2, "max_queue_delay_us": 0})
    assert req.instances == [2] and req.max_queue_delay_us == [0]


# ---- open loop: the search walks the request rates ---------------------------------------------------------

RATES = [50.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0, 400.0]


def open_loop(capacity: float, base_ms: float = 2.0, limited_from: float | None = None) -> Callable[[float], Step]:
    """An open-loop server of ``capacity`` requests/s: it completes what is offered up to its capacity, its
    p99 grows with utilisation (M/M/1-like); from ``limited_from`` on, the client could not keep the schedule,
    so the step has a throughput but no p99 (it moved to the result's details)."""
    def measure(rate: float) -> Step:
        util = min(rate / capacity, 0.99)
        p99 = None if limited_from is not None and rate >= limited_from else base_ms / (1 - util)
        return Step(rate, min(rate, capacity), p99)
    return measure


def test_rate_climb_stops_once_the_achieved_rate_stops_growing() -> None:
    """Offered 200, 250, 300/s all achieve 180/s: the gain over two steps drops under 5 % at 300/s."""
    d, measured = run(RATES, open_loop(capacity=180.0), load="rate")
    assert measured == RATES[:6] and len(measured) < len(RATES)
    assert d.best is not None and d.best.level == 200.0 and d.best.throughput == 180.0
    assert "stopped at rate=300/s" in d.reason and "under 5%" in d.reason


def test_rate_climb_walks_the_whole_list_below_saturation() -> None:
    d, measured = run(RATES, open_loop(capacity=1000.0), load="rate")
    assert measured == RATES and d.best is not None and d.best.level == 400.0 and "end of the rate list" in d.reason


@pytest.mark.parametrize("budget", [3.0, 5.0, 10.0, 40.0])
def test_rate_bisection_finds_the_highest_rate_within_the_budget(budget: float) -> None:
    curve = open_loop(capacity=320.0)
    d, measured = run(RATES, curve, p99_ms=budget, load="rate")
    within = [r for r in RATES if (curve(r).p99_ms or 0) <= budget]
    assert d.best is not None and d.best.level == max(within)  # throughput grows with the rate below capacity
    assert len(measured) <= 4 < len(RATES)  # ceil(log2(8 + 1))
    assert f"highest rate within p99 {budget:g} ms is rate={max(within):g}/s" in d.reason


def test_rate_bisection_counts_a_step_without_p99_or_failed_as_over_budget() -> None:
    limited = open_loop(capacity=1000.0, limited_from=300.0)  # p99 well within 100 ms, but unknown from 300/s
    d, measured = run(RATES, limited, p99_ms=100.0, load="rate")
    assert d.best is not None and d.best.level == 250.0 and 300.0 in measured
    failing = lambda r: Step(r, None if r >= 200 else r, 1.0)  # noqa: E731
    d, _ = run(RATES, failing, p99_ms=100.0, load="rate")
    assert d.best is not None and d.best.level == 150.0
    d, measured = run(RATES, open_loop(capacity=100.0, base_ms=5.0), p99_ms=1.0, load="rate")
    assert d.best is None and measured[-1] == 50.0 and "rate=50/s already exceeds" in d.reason


@pytest.mark.usefixtures("search_hook")
def test_the_scheduler_walks_the_rates_of_an_open_loop_search(sqlite_url: str, example_onnx: Path) -> None:
    """Against a real (SQLite) ledger: each next step is a job of the next rate (its own id, its rate in its
    measurement, the same concurrency); the report says the search walks the rate."""
    from farm.db.session import session_scope
    from scheduler.enqueue import submit
    from scheduler.search import search_report
    from schemas import JobResult, ProfileRequest
    from workers import ledger

    curve = open_loop(capacity=180.0)
    sub = submit(ProfileRequest(model=str(example_onnx), rates=RATES, concurrency=[2],
                                measurement={"search": "quick", "mode": "poisson"}), send=False)
    rid, ran, ids = sub.request_id, [], set()
    todo = [j.job_id for j in sub.expansion.jobs]
    while todo:
        job_id = todo.pop(0)
        spec = ledger.claim(job_id, "w1")
        assert spec is not None and ledger.start(job_id, "w1") and spec.measurement.rate is not None
        assert spec.concurrency == 2 and spec.measurement.mode == "poisson"
        step = curve(spec.measurement.rate)
        assert ledger.finish(spec, "w1", JobResult(job_id=job_id, metrics={
            "throughput_infer_per_s": step.throughput, "latency_p99_ms": step.p99_ms}))
        ran.append(spec.measurement.rate)
        ids.add(job_id)
        with session_scope() as s:
            todo += [j for j, _ in lifecycle.resumable(s, rid) if j not in todo]
    assert ran == RATES[:6] and len(ids) == len(ran)
    (report,) = search_report(rid)
    assert report["load"] == "rate" and report["done"] and report["measured"] == RATES[:6]
    assert report["best"]["rate"] == 200.0 and "rate=300/s" in report["state"]
    assert "measured rate=50,100,150,200,250,300/s" in report["state"]

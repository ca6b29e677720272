from __future__ import annotations

from typing import Any

from schemas import MeasurementSettings
from schemas.llm import LlmSettings
from schemas.load_levels import ClosedLoop, PoissonRate
from workers.loadgen.contract import LoadJob, WindowFigures
from workers.loadgen.kserve.client import stop_rules as kserve_stop_rules
from workers.loadgen.openai.client import stop_rules
from workers.loadgen.openai.saturation import MIN_WINDOW_S, WINDOW_S, OverSaturation
from workers.loadgen.plan import WindowPlan
from workers.loadgen.stops import Duration, NoSuccess, Progress, RequestCount, Stable, end_s


def _progress(now: float, done: int = 0, **seen: Any) -> Progress:
    return Progress(now=now, t_start=100.0, warmup_s=1.0, measured_done=done, **seen)


def test_the_request_count_and_duration_rules() -> None:
    count, limit = RequestCount(5), Duration(30.0)
    assert count.should_stop(_progress(101.0, done=4)) is None
    assert count.should_stop(_progress(101.0, done=5)) == "5 measured requests completed"
    assert limit.should_stop(_progress(129.9)) is None and limit.should_stop(_progress(130.0)) == "30 s ran"
    assert not count.sampled and not limit.sampled and not count.ends_span
    assert end_s([count, limit], 12.0) == 30.0 and end_s([count], 12.0) == 12.0  # else the plan's span


def test_the_over_saturation_rule_waits_a_window_after_the_warm_up_then_asks_the_verdict() -> None:
    rule = OverSaturation.of(measured_s=30.0, rate=10.0)
    assert rule.window_s == WINDOW_S and OverSaturation.of(3.0, None).window_s == MIN_WINDOW_S
    assert rule.sampled and rule.ends_span and rule.limit_s is None
    growing = [(100.0 + i / 10, float(i)) for i in range(80)]  # in flight climbing 10/s
    climbing = [(100.0 + i / 10, 50.0 * i) for i in range(80)]  # TTFT climbing 500 ms/s
    assert rule.should_stop(_progress(104.9, in_flight=growing, first_ms=climbing)) is None  # before warm-up + window
    why = rule.should_stop(_progress(107.9, in_flight=growing, first_ms=climbing))
    assert why is not None and why.startswith("over-saturated")
    flat = [(t, 3.0) for t, _ in growing]
    assert rule.should_stop(_progress(107.9, in_flight=flat, first_ms=climbing)) is None


def _job(load: ClosedLoop | PoissonRate, search: str = "brute") -> LoadJob:
    # the fields stop_rules reads (a max-goodput search's other requirements, an LLM and its SLO, left out)
    settings = MeasurementSettings.model_construct(search=search, timeout_s=120.0)
    return LoadJob(url="h:1", model_name="m", inputs=(), batch_size=1, load=load, settings=settings)


def test_the_openai_client_builds_its_stop_rules_from_the_job() -> None:
    plan = WindowPlan(1.0, (3.0, 3.0), 2, False)
    assert stop_rules(_job(ClosedLoop(concurrency=2)), plan, LlmSettings()) == ()
    assert stop_rules(_job(ClosedLoop(concurrency=2)), plan, LlmSettings(requests=20)) == (RequestCount(20),
                                                                                         Duration(120.0))
    goodput = stop_rules(_job(PoissonRate(rate=4.0), "max-goodput"), plan, LlmSettings())
    assert goodput == (OverSaturation(MIN_WINDOW_S, 4.0),)
    assert stop_rules(_job(ClosedLoop(concurrency=2), "max-goodput"), plan, LlmSettings()) == ()  # open loop only


def _window(k: int, requests: int, p50_ms: float) -> WindowFigures:
    rate = requests / 2.0
    return WindowFigures(k=k, t_s=2.0 * k, length_s=2.0, requests=requests, errors=0, requests_per_s=rate,
                         throughput_infer_per_s=rate, mean_ms=p50_ms, p50_ms=p50_ms, p99_ms=p50_ms)


def test_the_no_success_rule_waits_for_a_window_then_stops_a_run_with_nothing_succeeded() -> None:
    rule = NoSuccess()
    assert rule.should_stop(_progress(101.0, windows=[], succeeded=0)) is None  # no window merged yet
    assert rule.should_stop(_progress(103.0, windows=[_window(0, 0, 1.0)], succeeded=0)) == "no request succeeded"
    assert rule.should_stop(_progress(103.0, windows=[_window(0, 0, 1.0)], succeeded=3)) is None  # warm-up ones
    assert rule.should_stop(_progress(103.0, windows=[_window(0, 0, 1.0)])) is None  # a loop that does not count


def test_the_stable_rule_asks_the_jobs_stability_rule_on_the_merged_windows() -> None:
    settings = MeasurementSettings(min_windows=3, stability_pct=10.0)
    rule = Stable(settings)
    steady = [_window(k, 100, 5.0) for k in range(3)]
    drifting = [_window(k, 100 + 40 * k, 5.0 + 3 * k) for k in range(3)]
    assert rule.should_stop(_progress(107.0, windows=steady[:2])) is None  # fewer than min_windows
    assert rule.should_stop(_progress(107.0, windows=steady)) == "stable over the last 3 windows"
    assert rule.should_stop(_progress(107.0, windows=drifting)) is None


def test_the_grpc_client_builds_its_stop_rules_from_the_job_and_plan() -> None:
    job = _job(ClosedLoop(concurrency=2))
    until_stable, fixed = WindowPlan(1.0, (3.0, 3.0), 2, True), WindowPlan(1.0, (3.0, 3.0), 2, False)
    assert kserve_stop_rules(job, until_stable) == (NoSuccess(), Stable(job.settings), Duration(120.0))
    assert kserve_stop_rules(job, fixed) == (NoSuccess(), Duration(120.0))
    assert end_s(kserve_stop_rules(job, fixed), float("inf")) == 120.0


def test_a_load_speaks_its_jobs_protocol_else_the_one_its_settings_say() -> None:
    """``LoadJob.protocol``: the job's (``JobSpec.protocol``) where given, else OpenAI exactly where the settings
    carry LLM settings (callers without a job)."""
    from workers.loadgen.contract import LoadSpec

    plain, llm = MeasurementSettings(), MeasurementSettings(llm=LlmSettings())
    for settings, protocol in ((plain, "kserve"), (llm, "openai")):
        job = LoadJob(url="h:1", model_name="m", inputs=(), batch_size=1, load=ClosedLoop(concurrency=1),
                      settings=settings)
        assert job.protocol == protocol
    assert LoadSpec((), 1, ClosedLoop(concurrency=1), plain, protocol="openai").protocol == "openai"
    assert LoadSpec.from_settings([], 1, 1, llm).protocol == "openai"

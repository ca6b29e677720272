from __future__ import annotations

import pytest

from farm.errors import RequestError
from farm.readers.report import LIMITS_NOT_ENFORCED, build_report, parse_constraint


def _row(job: str, device: str = "cpu", status: str = "succeeded", edge: str | None = None, **metrics):  # type: ignore[no-untyped-def]
    return {"job_id": job, "device": device, "engine": "onnxruntime", "batch_size": 1, "concurrency": 1,
            "edge_profile": edge, "status": status, "error": None, "stable": True, **metrics}


ROWS = [
    _row("a", throughput_infer_per_s=100.0, latency_p99_ms=5.0),
    _row("b", throughput_infer_per_s=400.0, latency_p99_ms=30.0),
    _row("c", throughput_infer_per_s=250.0, latency_p99_ms=12.0),
    _row("d", device="gpu:t4", throughput_infer_per_s=900.0, latency_p99_ms=8.0),
    _row("e", status="failed"),
    _row("f", throughput_infer_per_s=300.0, latency_p99_ms=9.0, stable=False),
    _row("g", edge="pi4", throughput_infer_per_s=40.0, latency_p99_ms=15.0, oom_killed=False, limits_enforced=True),
    _row("h", edge="tiny", status="failed", oom_killed=True),
]


def test_best_throughput_under_a_p99_budget() -> None:
    rep = build_report(ROWS, constraints=[parse_constraint("latency_p99_ms=20")])
    assert [r["job_id"] for r in rep.ranked] == ["d", "f", "c", "a"]
    assert rep.best_per_device["cpu"]["job_id"] == "f" and rep.best_per_device["gpu:t4"]["job_id"] == "d"
    reasons = dict((r["job_id"], why) for r, why in rep.rejected)
    assert reasons["b"] == "violates latency_p99_ms <= 20" and reasons["e"].startswith("failed")


def test_stability_can_be_required_and_lower_is_better_objectives_sort_ascending() -> None:
    rep = build_report(ROWS, objective="latency_p99_ms", require_stable=True)
    assert [r["job_id"] for r in rep.ranked] == ["a", "d", "c", "b"]
    assert "did not stabilise" in dict((r["job_id"], w) for r, w in rep.rejected)["f"]


def test_edge_profiles_get_a_verdict() -> None:
    rep = build_report(ROWS, constraints=[parse_constraint("latency_p99_ms<=20")])
    verdict = {e["edge_profile"]: (e["fits"], e["reason"]) for e in rep.edge}
    assert verdict == {"pi4": (True, None), "tiny": (False, "killed: out of memory")}


def test_an_edge_run_without_enforced_limits_gets_no_fits_verdict() -> None:
    """A pod's process runner on a read-only cgroup fs: the run passed, but not under the profile's limits."""
    rows = [_row("u", edge="pi4", throughput_infer_per_s=40.0, latency_p99_ms=15.0, oom_killed=False,
                 limits_enforced=False),
            _row("n", edge="pi5", throughput_infer_per_s=40.0, latency_p99_ms=15.0),  # not recorded
            _row("s", edge="pi3", throughput_infer_per_s=40.0, latency_p99_ms=45.0, limits_enforced=False)]
    rep = build_report(rows, constraints=[parse_constraint("latency_p99_ms<=20")])
    verdict = {e["edge_profile"]: (e["fits"], e["reason"]) for e in rep.edge}
    assert verdict == {"pi4": (None, LIMITS_NOT_ENFORCED), "pi5": (None, LIMITS_NOT_ENFORCED),
                       # too slow even with the whole host: it cannot fit under tighter limits either
                       "pi3": (False, "violates latency_p99_ms <= 20")}
    assert LIMITS_NOT_ENFORCED == "limits not enforced: verdict unknown"


@pytest.mark.parametrize("text", ["p99=20", "latency_p99_ms", "latency_p99_ms=fast", "params=3",
                                  "latency_p99_ms=nan"])
def test_bad_constraints_are_refused(text: str) -> None:
    with pytest.raises(RequestError):
        parse_constraint(text)


def test_higher_is_better_constraints_are_lower_bounds() -> None:
    c = parse_constraint("throughput_infer_per_s=200")
    assert str(c) == "throughput_infer_per_s >= 200"
    assert c.holds({"throughput_infer_per_s": 250}) and not c.holds({"throughput_infer_per_s": 150})
    assert not c.holds({"throughput_infer_per_s": None})


def test_report_groups_by_serving_configuration() -> None:
    """The best row of each (device, engine, batch, instances, threads, queue delay) group, in rank order."""
    def cell(job: str, instances: int, delay: int | None, c: int, tput: float, p99: float) -> dict[str, object]:
        return {**_row(job, throughput_infer_per_s=tput, latency_p99_ms=p99), "concurrency": c,
                "instances": instances, "threads": 0, "max_queue_delay_us": delay, "preferred_batch_size": None}

    rows = [cell("a", 1, None, 1, 100.0, 2.0), cell("b", 1, None, 4, 180.0, 9.0),
            cell("c", 2, None, 4, 260.0, 8.0), cell("d", 2, None, 8, 300.0, 30.0),
            cell("e", 1, 500, 8, 320.0, 6.0), cell("f", 1, 500, 2, 150.0, 3.0)]
    rep = build_report(rows, constraints=[parse_constraint("latency_p99_ms=10")])
    assert [r["job_id"] for r in rep.best_per_serving] == ["e", "c", "b"]
    assert [(r["instances"], r["max_queue_delay_us"]) for r in rep.best_per_serving] == [(1, 500), (2, None),
                                                                                          (1, None)]


def test_open_loop_rates_are_steps_of_one_serving_configuration() -> None:
    """Rows at different rates of one serving configuration: one group, its best rate within the budget."""
    from farm.readers.report import SERVING_GROUP

    rows = [{**_row(f"r{r}", throughput_infer_per_s=float(r), latency_p99_ms=r / 20), "rate": float(r)}
            for r in (50, 100, 150, 200)]
    rep = build_report(rows, constraints=[parse_constraint("latency_p99_ms=8")])
    assert "rate" not in SERVING_GROUP and "concurrency" not in SERVING_GROUP
    assert [r["job_id"] for r in rep.best_per_serving] == ["r150"]
    assert [r["job_id"] for r in rep.ranked] == ["r150", "r100", "r50"]


def test_client_limited_measurements_are_not_ranked() -> None:
    rows = [*ROWS[:4], _row("x", throughput_infer_per_s=999.0, late_send_pct=4.0),
            _row("y", throughput_infer_per_s=998.0, latency_p99_ms=1.0, late_send_pct=0.5)]
    rep = build_report(rows)
    assert [r["job_id"] for r in rep.ranked][:1] == ["y"] and "x" not in [r["job_id"] for r in rep.ranked]
    assert dict((r["job_id"], w) for r, w in rep.rejected)["x"].startswith("client-limited")

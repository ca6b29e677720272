from __future__ import annotations

import pytest

from farm.errors import RequestError
from farm.report import build_report, parse_constraint


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
    _row("g", edge="pi4", throughput_infer_per_s=40.0, latency_p99_ms=15.0, oom_killed=False),
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


def test_client_limited_measurements_are_not_ranked() -> None:
    rows = [*ROWS[:4], _row("x", throughput_infer_per_s=999.0, late_send_pct=4.0),
            _row("y", throughput_infer_per_s=998.0, latency_p99_ms=1.0, late_send_pct=0.5)]
    rep = build_report(rows)
    assert [r["job_id"] for r in rep.ranked][:1] == ["y"] and "x" not in [r["job_id"] for r in rep.ranked]
    assert dict((r["job_id"], w) for r, w in rep.rejected)["x"].startswith("client-limited")

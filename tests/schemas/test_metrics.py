from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from schemas import JobResult
from schemas.metrics import METRICS, Aggregation, aggregate, merge_repeats, metric


def test_every_metric_declares_name_unit_direction_and_aggregation() -> None:
    assert len({m.name for m in METRICS}) == len(METRICS)
    for m in METRICS:
        assert m.name and m.name.isidentifier()
        assert m.unit
        assert isinstance(m.higher_is_better, bool)
        assert m.aggregation in get_args(Aggregation)
        assert m.kind in ("float", "int", "bool")
        assert m.description
        assert m.scope in ("job", "model")


def test_unknown_metric_names_the_known_ones() -> None:
    try:
        metric("latency_p42")
    except KeyError as exc:
        assert "latency_p99_ms" in str(exc)
    else:
        raise AssertionError("expected KeyError")


def test_job_result_with_an_unknown_metric_fails_when_built() -> None:
    with pytest.raises(ValidationError, match="latency_p42"):
        JobResult(job_id="j", metrics={"latency_p42": 1.0})
    with pytest.raises(ValidationError, match="params"):  # a model metric is not a job result
        JobResult(job_id="j", metrics={"params": 10})
    assert JobResult(job_id="j", metrics={"latency_p99_ms": 2.0, "stable": True}).metrics["stable"] is True


def test_aggregate_applies_each_metrics_declared_aggregation() -> None:
    assert aggregate("latency_p50_ms", [1.0, 2.0, None, 6.0]) == pytest.approx(3.0)  # mean
    assert aggregate("latency_max_ms", [3.0, 9.0, 4.0]) == 9.0  # max
    assert aggregate("error_count", [1, 2, 3]) == 6  # sum
    assert aggregate("mem_limit_bytes", [1, 2, 3]) == 3  # last
    assert aggregate("stable", [True, False]) is False  # all
    assert aggregate("stable", [True, True]) is True
    assert aggregate("latency_p50_ms", [None, None]) is None
    with pytest.raises(KeyError):
        aggregate("nope", [1])


def test_merge_repeats_keeps_every_metric_any_run_measured() -> None:
    runs = [{"throughput_infer_per_s": 100.0, "oom_killed": False},
            {"throughput_infer_per_s": 200.0, "oom_killed": True, "windows": 3}]
    assert merge_repeats(runs) == {"throughput_infer_per_s": 150.0, "oom_killed": False, "windows": 3}
    assert merge_repeats([]) == {}
    assert merge_repeats([{"latency_p99_ms": 5.0}]) == {"latency_p99_ms": 5.0}


def test_every_metric_has_a_title_and_a_short_label() -> None:
    """Tables (80 columns) and plot axes read these; a metric without them would show its raw name."""
    from schemas.metrics import LABELS, METRICS

    assert set(LABELS) == {m.name for m in METRICS}
    for m in METRICS:
        assert m.title and "_" not in m.title, m.title
        assert 0 < len(m.label) <= 10, m.label
        assert m.unit not in m.axis_label or m.axis_label.endswith(f"({m.unit})")

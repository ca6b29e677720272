from __future__ import annotations

from farm.db.models import Result
from farm.metrics import JOB_METRICS, METRICS, MODEL_METRICS, metric


def test_every_metric_declares_name_unit_direction_and_aggregation() -> None:
    assert len({m.name for m in METRICS}) == len(METRICS)
    for m in METRICS:
        assert m.name and m.name.isidentifier()
        assert m.unit
        assert isinstance(m.higher_is_better, bool)
        assert m.aggregation in ("mean", "max", "min", "sum", "last", "all")
        assert m.kind in ("float", "int", "bool")
        assert m.description
        assert m.scope in ("job", "model")


def test_results_table_has_one_nullable_column_per_job_metric() -> None:
    cols = Result.__table__.columns
    for m in JOB_METRICS:
        assert m.name in cols and cols[m.name].nullable
    assert not any(m.name in cols for m in MODEL_METRICS)


def test_static_analysis_reports_every_model_metric(example_onnx) -> None:  # type: ignore[no-untyped-def]
    from farm.models.analysis import analyze

    report = analyze(example_onnx, "onnx")
    for m in MODEL_METRICS:
        assert m.name in report, m.name


def test_unknown_metric_names_the_known_ones() -> None:
    try:
        metric("latency_p42")
    except KeyError as exc:
        assert "latency_p99_ms" in str(exc)
    else:
        raise AssertionError("expected KeyError")

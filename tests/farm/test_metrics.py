from __future__ import annotations

from farm.db.models import Result
from schemas.metrics import JOB_METRICS, MODEL_METRICS


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

from __future__ import annotations

from farm.db.models import Result
from farm.metrics import METRICS, metric


def test_every_metric_declares_name_unit_direction_and_aggregation() -> None:
    assert len({m.name for m in METRICS}) == len(METRICS)
    for m in METRICS:
        assert m.name and m.name.isidentifier()
        assert m.unit
        assert isinstance(m.higher_is_better, bool)
        assert m.aggregation in ("mean", "max", "min", "sum", "last", "all")
        assert m.kind in ("float", "int", "bool")
        assert m.description


def test_results_table_has_one_nullable_column_per_metric() -> None:
    cols = Result.__table__.columns
    for m in METRICS:
        assert m.name in cols and cols[m.name].nullable


def test_unknown_metric_names_the_known_ones() -> None:
    try:
        metric("latency_p42")
    except KeyError as exc:
        assert "latency_p99_ms" in str(exc)
    else:
        raise AssertionError("expected KeyError")

"""The ``job_results`` view (migrations 0004, 0005, 0006) on SQLite and Postgres: every coordinate and metric, and the
SQL of docs/metrics.md for the usual questions answers what the Python rows say."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import inspect, text

from farm.db.session import get_engine
from farm.db.views import LOAD, PLACEMENT, SPEC_DIMENSIONS
from farm.readers.results import result_rows
from schemas.metrics import JOB_METRICS
from schemas.result import PLACEMENT_COLUMNS
from tests.farm.results_data import seed_request

METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _docs_sql() -> list[str]:
    """The SQL blocks of docs/metrics.md that query the view, in order."""
    blocks = re.findall(r"```sql\n(.*?)```", METRICS_PAGE.read_text(), flags=re.S)
    return [b for b in blocks if "FROM job_results" in b]


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A migrated database of either kind, empty of farm rows, set as FARM_DATABASE_URL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("cluster_env")["FARM_DATABASE_URL"])


def _query(url: str, sql: str, rid: str) -> list[dict[str, Any]]:
    with get_engine(url).connect() as conn:
        return [dict(r) for r in conn.execute(text(sql), {"request_id": rid}).mappings()]


def _make_open_loop(rid: str, rate: float) -> str:
    """Turn one job of the request into an open-loop (Poisson) job at ``rate`` req/s (its spec and its rate
    column); returns its id."""
    from sqlalchemy import select

    from farm.db.models import Job
    from farm.db.session import session_scope

    with session_scope() as s:
        job = s.execute(select(Job).where(Job.request_id == rid, Job.edge_profile.is_(None)).limit(1)).scalar_one()
        job.spec = {**job.spec, "measurement": {**job.spec["measurement"], "mode": "poisson", "rate": rate}}
        job.rate = rate
        return str(job.id)


def test_the_view_has_every_coordinate_placement_and_metric_and_one_row_per_job(db_url: str) -> None:
    rid = seed_request(np.random.default_rng(3))
    open_loop = _make_open_loop(rid, 120.5)
    columns = [c["name"] for c in inspect(get_engine(db_url)).get_columns("job_results")]
    assert PLACEMENT == PLACEMENT_COLUMNS
    need = {"request_id", "model", "job_id", "device", "engine", "batch_size", "concurrency", *LOAD, "edge_profile",
            "rpc", "status", "measured", *SPEC_DIMENSIONS, *PLACEMENT, *(m.name for m in JOB_METRICS)}
    assert need <= set(columns), need - set(columns)
    view = {r["job_id"]: r for r in _query(db_url, "SELECT * FROM job_results WHERE request_id = :request_id", rid)}
    rows = result_rows(rid)
    assert set(view) == {r["job_id"] for r in rows}
    for r in rows:
        v = view[r["job_id"]]
        for c in ("device", "engine", "batch_size", "concurrency", "rate", "edge_profile", "status", *SPEC_DIMENSIONS):
            assert v[c] == r[c], (c, v[c], r[c])
        for m in JOB_METRICS:
            assert (v[m.name] is None) == (r[m.name] is None) and (r[m.name] is None or v[m.name] == r[m.name])
        assert v["model"] == "mlp.onnx" and ("in-process" in v["measured"]) == bool(r["edge_profile"])
        assert v["measured"] == r["measured"]  # one wording (schemas.measured) in SQL and in Python
        assert v["mode"] == ("poisson" if r["job_id"] == open_loop else "closed")
    assert view[open_loop]["rate"] == 120.5


def test_the_docs_sql_answers_the_usual_questions(db_url: str) -> None:
    rid = seed_request(np.random.default_rng(4))
    best_sql, cheapest_sql, edge_sql = _docs_sql()
    rows = [r for r in result_rows(rid) if r["status"] == "succeeded"]
    serving = [r for r in rows if not r["edge_profile"]]

    best = _query(db_url, best_sql, rid)
    expect = {}
    for r in serving:
        if r["latency_p99_ms"] <= 20:
            key = (r["device"], r["engine"])
            if key not in expect or r["throughput_infer_per_s"] > expect[key]["throughput_infer_per_s"]:
                expect[key] = r
    assert expect and [(b["device"], b["engine"], b["batch_size"], b["concurrency"]) for b in best] == \
        [(*k, expect[k]["batch_size"], expect[k]["concurrency"]) for k in sorted(expect)]

    cheapest = _query(db_url, cheapest_sql, rid)
    assert len(cheapest) == 1
    meets = {r["device"] for r in serving if r["throughput_infer_per_s"] >= 2000}
    assert cheapest[0]["device"] == ("cpu" if "cpu" in meets else "gpu:t4")
    assert float(cheapest[0]["best_infer_per_s"]) == max(r["throughput_infer_per_s"] for r in serving
                                                         if r["device"] == cheapest[0]["device"])

    edge = _query(db_url, edge_sql, rid)
    assert [e["edge_profile"] for e in edge] == sorted(r["edge_profile"] for r in rows
                                                       if r["edge_profile"] and not r["oom_killed"])
    assert edge and float(edge[0]["mem_limit_mib"]) == 512.0


def test_a_later_migration_can_rebuild_a_table_the_view_names_on_sqlite(sqlite_url: str) -> None:
    """SQLite refuses to rename a rebuilt table while a view names it; ``view_dropped`` is the way round."""
    import sqlalchemy as sa
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    from farm.db.views import view_dropped

    seed_request(np.random.default_rng(5), edge=False, failed=False, devices=("cpu",), batches=(1,))
    metrics = [m.name for m in JOB_METRICS]
    with get_engine(sqlite_url).begin() as conn:
        op = Operations(MigrationContext.configure(conn))
        with view_dropped(op, metrics), op.batch_alter_table("results", recreate="always") as batch:
            batch.add_column(sa.Column("extra", sa.Float(), nullable=True))
        assert conn.execute(text("SELECT count(*) FROM job_results")).scalar_one() == 4

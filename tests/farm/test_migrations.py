"""The Alembic migrations create farm's tables on Postgres and SQLite and match the ORM models."""
from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from farm.db.migrate import is_current, upgrade
from farm.db.models import Base
from farm.db.session import get_engine

TABLES = {"requests", "jobs", "results", "workers", "model_artifacts"}


def _diff(url: str) -> list[object]:
    with get_engine(url).connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "render_as_batch": True})
        return compare_metadata(ctx, Base.metadata)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migrations_create_tables_without_drift(backend: str, tmp_path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    upgrade(url)
    upgrade(url)  # idempotent
    assert is_current(url)
    assert TABLES <= set(inspect(get_engine(url)).get_table_names())
    assert _diff(url) == []


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_database_at_the_first_revision_upgrades_and_keeps_its_rows(
        backend: str, tmp_path, request: pytest.FixtureRequest) -> None:
    """An existing farm database (revision 0001, with a request in it) gains the steal column and the
    placement columns on upgrade, keeps its rows, and the step back works too."""
    from alembic import command
    from sqlalchemy import text

    from farm.db.migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'm.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    cfg = alembic_config(url)

    def downgrade(revision: str) -> None:
        with get_engine(url).begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)

    upgrade(url)
    downgrade("base")  # the fixture's database may come migrated already
    upgrade(url, "0001")
    assert not is_current(url)
    with get_engine(url).begin() as conn:
        conn.execute(text("INSERT INTO model_artifacts (sha256, filename, format, size_bytes, content, inputs, "
                          "created_at) VALUES ('ab', 'm.onnx', 'onnx', 1, :c, '[]', CURRENT_TIMESTAMP)"),
                     {"c": b"x"})
        conn.execute(text("INSERT INTO requests (id, model_sha256, spec, excluded, created_at) "
                          "VALUES ('r1', 'ab', '{}', '[]', CURRENT_TIMESTAMP)"))
    upgrade(url)
    assert is_current(url) and _diff(url) == []
    columns = {c["name"] for c in inspect(get_engine(url)).get_columns("results")}
    assert {"cpu_steal_pct", "host", "slot", "gpu_uuid", "server_cpus", "loadgen_cpus", "host_shared",
            "isolated"} <= columns
    with get_engine(url).connect() as conn:
        assert conn.execute(text("SELECT id FROM requests")).scalars().all() == ["r1"]
    assert "job_results" in inspect(get_engine(url)).get_view_names()
    downgrade("0002")
    assert "job_results" not in inspect(get_engine(url)).get_view_names()
    assert "host_shared" not in {c["name"] for c in inspect(get_engine(url)).get_columns("results")}
    downgrade("0001")
    assert "cpu_steal_pct" not in {c["name"] for c in inspect(get_engine(url)).get_columns("results")}

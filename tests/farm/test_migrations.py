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

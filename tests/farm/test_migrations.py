"""The Alembic migrations create farm's tables on Postgres and SQLite and match the ORM models."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from farm.db.migrate import alembic_config, is_current, upgrade
from farm.db.models import Base
from farm.db.session import get_engine

TABLES = {"requests", "jobs", "results", "workers", "model_artifacts"}


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty database of ``backend`` (its earlier revisions undone), at no revision."""
    url = f"sqlite:///{tmp_path / 'm.db'}" if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    upgrade(url)
    if backend == "postgres":  # the session's database holds what earlier tests of this process left (cluster_env
        _empty(url)  # empties it before a test, not after): 0012's step back would look for their models' bytes
    _downgrade(url, "base")  # the fixture's database may come migrated already
    return url


def _empty(url: str) -> None:
    """Every table of the Postgres database at ``url`` emptied (its schema and revision kept)."""
    with get_engine(url).begin() as conn:
        names = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                                  "AND tablename <> 'alembic_version'")).scalars().all()
        if names:
            conn.execute(text("TRUNCATE " + ", ".join(f'"{n}"' for n in names) + " CASCADE"))


def _downgrade(url: str, revision: str) -> None:
    cfg = alembic_config(url)
    with get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def _add_request(url: str) -> None:
    """A model and a request ``r1`` (what an existing farm database holds)."""
    with get_engine(url).begin() as conn:
        conn.execute(text("INSERT INTO model_artifacts (sha256, filename, format, size_bytes, content, inputs, "
                          "created_at) VALUES ('ab', 'm.onnx', 'onnx', 1, :c, '[]', CURRENT_TIMESTAMP)"),
                     {"c": b"x"})
        conn.execute(text("INSERT INTO requests (id, model_sha256, spec, excluded, created_at) "
                          "VALUES ('r1', 'ab', '{}', '[]', CURRENT_TIMESTAMP)"))


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
    url = _url(backend, tmp_path, request)
    upgrade(url, "0001")
    assert not is_current(url)
    _add_request(url)
    upgrade(url)
    assert is_current(url) and _diff(url) == []
    columns = {c["name"] for c in inspect(get_engine(url)).get_columns("results")}
    assert {"cpu_steal_pct", "host", "slot", "gpu_uuid", "server_cpus", "loadgen_cpus", "host_shared",
            "isolated"} <= columns
    with get_engine(url).connect() as conn:
        assert conn.execute(text("SELECT id FROM requests")).scalars().all() == ["r1"]
    assert "job_results" in inspect(get_engine(url)).get_view_names()
    _downgrade(url, "0002")
    assert "job_results" not in inspect(get_engine(url)).get_view_names()
    assert "host_shared" not in {c["name"] for c in inspect(get_engine(url)).get_columns("results")}
    _downgrade(url, "0001")
    assert "cpu_steal_pct" not in {c["name"] for c in inspect(get_engine(url)).get_columns("results")}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_rate_column_is_filled_from_the_jobs_specs(backend: str, tmp_path, request: pytest.FixtureRequest) -> None:
    """Migration 0006 adds ``jobs.rate`` and fills it from each job's ``measurement.rate`` (NULL in closed
    loop); ``job_results`` reads the column, and the step back reads the spec again."""
    url = _url(backend, tmp_path, request)
    upgrade(url, "0005")
    _add_request(url)
    with get_engine(url).begin() as conn:
        for jid, m in (("open", {"mode": "poisson", "rate": 120.5}), ("closed", {"mode": "closed", "rate": None})):
            conn.execute(text("INSERT INTO jobs (id, request_id, device, engine, batch_size, concurrency, queue, "
                              "spec, status, attempts, created_at) VALUES (:id, 'r1', 'cpu', 'onnxruntime', 1, 1, "
                              "'farm.cpu', :spec, 'queued', 0, CURRENT_TIMESTAMP)"),
                         {"id": jid, "spec": json.dumps({"measurement": m})})
    rates = "SELECT job_id, rate FROM job_results ORDER BY job_id"
    upgrade(url)
    assert is_current(url) and _diff(url) == []
    with get_engine(url).connect() as conn:
        assert dict(conn.execute(text("SELECT id, rate FROM jobs")).all()) == {"open": 120.5, "closed": None}
        assert conn.execute(text(rates)).all() == [("closed", None), ("open", 120.5)]
    _downgrade(url, "0005")
    assert "rate" not in {c["name"] for c in inspect(get_engine(url)).get_columns("jobs")}
    with get_engine(url).connect() as conn:
        assert conn.execute(text(rates)).all() == [("closed", None), ("open", 120.5)]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_model_bytes_move_out_of_the_database_into_the_store(backend: str, tmp_path,
                                                                  request: pytest.FixtureRequest) -> None:
    """Migration 0012 copies each model's ``content`` into the model store (FARM_HOME/store here), records where,
    and drops the column; a row whose bytes do not match its sha256 gets no location. The step back copies the
    bytes into the column again."""
    import hashlib

    from farm.store.backends import open_store

    url = _url(backend, tmp_path, request)
    upgrade(url, "0011_api")
    data = bytes(range(256)) * 4096  # 1 MiB
    sha = hashlib.sha256(data).hexdigest()
    with get_engine(url).begin() as conn:
        for key, content in ((sha, data), ("f" * 64, b"not its bytes")):
            conn.execute(text("INSERT INTO model_artifacts (sha256, filename, format, size_bytes, content, inputs, "
                              "created_at) VALUES (:s, 'm.onnx', 'onnx', :n, :c, '[]', CURRENT_TIMESTAMP)"),
                         {"s": key, "n": len(content), "c": content})
        conn.execute(text("INSERT INTO requests (id, model_sha256, spec, excluded, created_at) "
                          "VALUES ('r1', :s, '{}', '[]', CURRENT_TIMESTAMP)"), {"s": sha})
    upgrade(url)
    assert is_current(url) and _diff(url) == []
    assert "content" not in {c["name"] for c in inspect(get_engine(url)).get_columns("model_artifacts")}
    store = open_store()
    with get_engine(url).connect() as conn:
        rows = dict(conn.execute(text("SELECT sha256, location || '|' || layout FROM model_artifacts")).all())
    assert rows == {sha: f"{store.url}|file", "f" * 64: "|file"}
    with store.get(sha) as blob:
        assert blob.read() == data
    assert not store.exists("f" * 64)
    with get_engine(url).begin() as conn:
        conn.execute(text("DELETE FROM model_artifacts WHERE sha256 = :s"), {"s": "f" * 64})
    _downgrade(url, "0011_api")
    with get_engine(url).connect() as conn:
        assert [bytes(c) for c in conn.execute(text("SELECT content FROM model_artifacts")).scalars()] == [data]

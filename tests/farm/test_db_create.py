"""``farm db upgrade`` on a Postgres database that does not exist: created when the role may, else the
exact ``createdb`` to run (against the real Postgres at 127.0.0.1:5432)."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, inspect, text

from tests.conftest import PG_ADMIN_URL, _answers

SERVER = PG_ADMIN_URL.rsplit("/", 1)[0]
pytestmark = pytest.mark.usefixtures("pg_url")  # marks these tests as Postgres users (tests/pg_lock.py)


@pytest.fixture
def admin() -> Iterator[object]:
    if not _answers("127.0.0.1", 5432):
        pytest.skip("PostgreSQL does not answer on 127.0.0.1:5432")
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def _farm(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FARM_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "farm", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _drop(admin: object, name: str) -> None:
    with admin.connect() as conn:  # type: ignore[attr-defined]
        conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


def test_upgrade_creates_a_missing_database(admin: object) -> None:
    name = f"farm_create_{uuid.uuid4().hex[:8]}"
    url = f"{SERVER}/{name}"
    try:
        done = _farm(url, "db", "upgrade")
        assert done.returncode == 0, done.stderr
        assert f"created database {url}" in done.stdout
        engine = create_engine(url)
        try:
            assert inspect(engine).has_table("jobs")
        finally:
            engine.dispose()
        again = _farm(url, "db", "upgrade")  # exists now: not created twice, just current
        assert again.returncode == 0, again.stderr
        assert "created database" not in again.stdout
    finally:
        _drop(admin, name)


def test_upgrade_without_the_right_says_the_createdb_to_run(admin: object) -> None:
    role, name = f"farm_nocreate_{uuid.uuid4().hex[:6]}", f"farm_create_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:  # type: ignore[attr-defined]
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN NOCREATEDB'))
    try:
        done = _farm(f"postgresql+psycopg2://{role}@127.0.0.1:5432/{name}", "db", "upgrade")
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr
        assert f"role {role} may not create databases" in lines[0]
        assert f"`createdb -h 127.0.0.1 -p 5432 -U postgres -O {role} {name}`" in lines[0]
        assert "did you run `farm db upgrade`" not in lines[0]
        with admin.connect() as conn:  # type: ignore[attr-defined]
            assert conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first() is None
    finally:
        with admin.connect() as conn:  # type: ignore[attr-defined]
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))

"""``farm db upgrade`` on Postgres gives the read-only role SELECT on the results views and nothing else: an
analyst logging in as a member reads job_results, and neither reads the identities' token digests nor writes."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from tests.helpers import farm, farm_env


def test_an_analyst_reads_the_results_views_and_nothing_else(pg_url: str) -> None:
    role = f"farm_reader_{uuid.uuid4().hex[:8]}"  # roles are cluster-wide: one per test run
    analyst = f"ana_{uuid.uuid4().hex[:8]}"
    out = farm("db", "upgrade", env=farm_env(FARM_DATABASE_URL=pg_url, FARM_READER_ROLE=role))
    assert f"read-only role {role}: SELECT on job_results, job_ops" in out.stderr
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE ROLE {analyst} LOGIN IN ROLE {role}"))
        url = make_url(pg_url).set(username=analyst, password=None)
        ana = create_engine(url)
        with ana.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM job_results")).scalar_one() >= 0
            conn.execute(text("SELECT count(*) FROM job_ops"))
        for sql in ("SELECT token_sha256 FROM identities", "SELECT * FROM jobs",
                    "DELETE FROM results", "SELECT * FROM audit_log"):
            with ana.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
                conn.execute(text(sql))
        ana.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE IF EXISTS {analyst}"))
            conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
        admin.dispose()

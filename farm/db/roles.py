"""Analysts keep SQL in a shared farm: ``farm db upgrade`` gives a read-only role, ``FARM_READER_ROLE``
(``farm_reader``), SELECT on the results views and nothing else: not the tables behind them, not the identities'
token digests, not the audit log. An operator hands it out as membership (docs/cluster.md "Analysts"):
``CREATE ROLE ana LOGIN PASSWORD '...' IN ROLE farm_reader``.

Run after every upgrade, not in a migration: a migration that recreates a view drops its grants, and a
database role may lack CREATEROLE (then the command says what to run, and the upgrade still succeeds)."""
from __future__ import annotations

import re

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from farm.db.op_views import VIEW as OPS_VIEW
from farm.db.session import get_engine
from farm.db.views import VIEW as RESULTS_VIEW
from farm.errors import ConfigError

#: the views the reader role may SELECT
READER_VIEWS = (RESULTS_VIEW, OPS_VIEW)
_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def reader_sql(role: str) -> list[str]:
    """The statements that make ``role`` (NOLOGIN) and grant it SELECT on the results views only."""
    if not _ROLE.match(role):
        raise ConfigError(f"FARM_READER_ROLE {role!r} must be a lower-case SQL identifier (letters, digits, _)")
    return [f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN "
            f"CREATE ROLE {role} NOLOGIN; END IF; END $$",
            f"GRANT USAGE ON SCHEMA public TO {role}",
            *(f"GRANT SELECT ON {view} TO {role}" for view in READER_VIEWS)]


def grant_reader(url: str, role: str) -> str:
    """Make ``role`` and its grants on the Postgres database ``url``; a line saying what was done, or what an
    administrator must run where farm's own role may not (SQLite: nothing to do)."""
    engine = get_engine(url)
    if engine.dialect.name != "postgresql":
        return "no read-only role on SQLite: analysts open the file read-only"
    statements = reader_sql(role)
    try:
        with engine.begin() as conn:
            for sql in statements:
                conn.execute(text(sql))
    except DBAPIError as exc:
        first = " ".join(str(exc.orig).split())[:160]
        return (f"could not create the read-only role {role} ({first}); as a Postgres superuser run: "
                + "; ".join(statements))
    return f"read-only role {role}: SELECT on {', '.join(READER_VIEWS)} (hand it out: CREATE ROLE NAME LOGIN IN ROLE " \
           f"{role})"

"""``farm db upgrade`` on a Postgres database that does not exist yet: create it through the server's
maintenance database when the role may (``CREATE DATABASE``), else say the exact ``createdb`` to run.

SQLite files are created by the driver itself; other backends are left to their own tools.
"""
from __future__ import annotations

import shlex

from psycopg2 import sql
from sqlalchemy import create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.pool import NullPool

from farm.errors import ConfigError

#: databases every Postgres server has, tried in turn to run CREATE DATABASE from
MAINTENANCE_DBS = ("postgres", "template1")
#: SQLSTATE of "database ... does not exist" (invalid_catalog_name)
MISSING_DB = "3D000"
#: SQLSTATE of "permission denied to create database" (insufficient_privilege)
NO_RIGHT = "42501"


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(getattr(exc, "orig", None), "pgcode", None)


def database_missing(url: str) -> bool:
    """True when ``url`` is a Postgres URL whose server answers but says its database does not exist."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql" or not parsed.database:
        return False
    engine = create_engine(parsed, poolclass=NullPool)
    try:
        with engine.connect():
            return False
    except OperationalError as exc:
        return _sqlstate(exc) == MISSING_DB or "does not exist" in str(exc.orig)
    finally:
        engine.dispose()


def createdb_command(parsed: URL, admin: str | None = None) -> str:
    """The ``createdb`` line that creates ``parsed``'s database (no password in it): as its own user, or
    as ``admin`` with ``parsed``'s user as the owner (so that the migrations may create tables)."""
    parts = ["createdb", "-h", parsed.host or "localhost"]
    if parsed.port:
        parts += ["-p", str(parsed.port)]
    if admin:
        parts += ["-U", admin]
        if parsed.username:
            parts += ["-O", parsed.username]
    elif parsed.username:
        parts += ["-U", parsed.username]
    parts.append(parsed.database or "")
    return " ".join(shlex.quote(p) for p in parts)


def _create(parsed: URL, maintenance: str) -> None:
    """CREATE DATABASE, which takes no bind parameter: the name is composed as an identifier by psycopg2.sql."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(parsed.database or ""))
    engine = create_engine(parsed.set(database=maintenance), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:  # psycopg2 renders the identifier; SQLAlchemy wraps the driver's errors
            conn.exec_driver_sql(statement.as_string(conn.connection.dbapi_connection))
    finally:
        engine.dispose()


def create_database(url: str) -> str:
    """Create ``url``'s missing Postgres database; returns the maintenance database used.

    Raises ConfigError with the exact ``createdb`` to run when the role may not create databases (or no
    maintenance database lets it in)."""
    parsed = make_url(url)
    why, admin = "no maintenance database (postgres, template1) accepted the connection", None
    for maintenance in MAINTENANCE_DBS:
        try:
            _create(parsed, maintenance)
            return maintenance
        except (OperationalError, ProgrammingError) as exc:
            if _sqlstate(exc) == NO_RIGHT:
                why, admin = f"role {parsed.username or '(default)'} may not create databases", "postgres"
                break
            if _sqlstate(exc) == "42P04":  # duplicate_database: created meanwhile by another process
                return maintenance
            why = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    raise ConfigError(f"database {parsed.database!r} does not exist on {parsed.host or 'localhost'} and "
                      f"farm could not create it ({why}); create it with `{createdb_command(parsed, admin)}`"
                      f"{' (or another role that may create databases)' if admin else ''}, "
                      "then run `farm db upgrade` again")


def ensure_database(url: str) -> bool:
    """Create ``url``'s Postgres database when it is missing; True when it was created."""
    if not database_missing(url):
        return False
    create_database(url)
    return True

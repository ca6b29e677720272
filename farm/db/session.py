"""Engines and sessions. SQLite (embedded default) gets WAL, a busy timeout and foreign keys."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from farm.errors import ConfigError
from farm.settings import get_settings, mask_url


@lru_cache(maxsize=8)
def _engine_for(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"database URL {mask_url(url)!r} is not valid; set FARM_DATABASE_URL "
                          "to e.g. postgresql+psycopg2://user@host/db or sqlite:///path.db") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


def get_engine(url: str | None = None) -> Engine:
    """The engine for ``url`` (default: the settings' database URL), built once per URL."""
    return _engine_for(url or get_settings().db_url)


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error, so nothing is half-written."""
    session = sessionmaker(bind=get_engine(url), expire_on_commit=False)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def dialect_insert(bind: Session | Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT on ``table`` in the dialect of ``bind`` (Postgres or SQLite), for ``ON CONFLICT`` clauses."""
    conn = bind.get_bind() if isinstance(bind, Session) else bind
    return postgresql.insert(table) if conn.dialect.name == "postgresql" else sqlite.insert(table)

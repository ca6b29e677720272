"""Alembic environment: the URL comes from the Alembic config (set by ``farm.db.migrate``) or settings."""
from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from farm.db.models import Base
from farm.db.session import get_engine

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = get_engine(config.get_main_option("sqlalchemy.url") or None)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True,
                      compare_type=True, poolclass=pool.NullPool)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

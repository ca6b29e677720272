"""Model bytes leave the database for the model store (issue 38): ``model_artifacts`` gains ``location`` (the
store's URL) and ``layout`` (``file``/``folder``); each row's ``content`` is copied into the configured store
(``farm.store.backends.open_store``: FARM_STORE_URL, default FARM_HOME/store), one row at a time, its sha256
checked as it passes, and the column is dropped. A row whose bytes do not match its sha256 (never servable: a
worker refused it) keeps an empty location. The step back copies file blobs into the column again; it refuses a
folder model (stored file by file, which the old schema cannot hold).

Revision ID: 0012_model_store
Revises: 0011_api
Create Date: 2026-11-29 03:30:00.000000
"""
from __future__ import annotations

import hashlib
import io
import sys

import sqlalchemy as sa
from alembic import op

from farm.errors import ArtifactError
from farm.store.backends import open_store

revision = '0012_model_store'
down_revision = '0011_api'
branch_labels = None
depends_on = None

_TABLE = sa.table('model_artifacts', sa.column('sha256', sa.String), sa.column('content', sa.LargeBinary),
                  sa.column('location', sa.String), sa.column('layout', sa.String))


def _move_out(conn: sa.Connection) -> None:
    """Copy each row's content into the store (one row in memory at a time) and record where. The store is opened
    only when there are rows to move: a new database needs none (nor its settings read while migrating)."""
    shas = conn.execute(sa.select(_TABLE.c.sha256).where(_TABLE.c.content.is_not(None))).scalars().all()
    store = open_store() if shas else None
    for sha in shas:
        assert store is not None
        data = conn.execute(sa.select(_TABLE.c.content).where(_TABLE.c.sha256 == sha)).scalar_one()
        location = store.url
        if hashlib.sha256(data).hexdigest() != sha:
            print(f"model {sha[:12]}: its bytes do not match its sha256 (never servable); left out of the store",
                  file=sys.stderr)
            location = ''
        else:
            store.put(sha, io.BytesIO(data), len(data))
        conn.execute(sa.update(_TABLE).where(_TABLE.c.sha256 == sha).values(location=location))
        del data


def _drop(*columns: str) -> None:
    """Drop columns in place (SQLite >= 3.35 and Postgres both can): a batch copy of the table would drop and
    recreate it, which SQLite's foreign keys (requests -> model_artifacts) refuse inside the migration."""
    for name in columns:
        op.execute(f'ALTER TABLE model_artifacts DROP COLUMN {name}')


def _no_server_defaults(*columns: str) -> None:
    """Postgres: the columns' temporary defaults go (SQLite keeps them: changing one needs a table copy)."""
    if op.get_bind().dialect.name != 'sqlite':
        for name in columns:
            op.alter_column('model_artifacts', name, server_default=None)


def upgrade() -> None:
    op.add_column('model_artifacts', sa.Column('location', sa.String(1024), nullable=False, server_default=''))
    op.add_column('model_artifacts', sa.Column('layout', sa.String(8), nullable=False, server_default='file'))
    _move_out(op.get_bind())
    _drop('content')
    _no_server_defaults('location', 'layout')


def _move_in(conn: sa.Connection) -> None:
    """Copy each file blob back into ``content``; ArtifactError for a folder model."""
    folders = conn.execute(sa.select(_TABLE.c.sha256).where(_TABLE.c.layout == 'folder')).scalars().all()
    if folders:
        raise ArtifactError(f"{len(folders)} folder model(s) ({folders[0][:12]}, ...) are stored file by file, "
                            "which the database before 0012 cannot hold; delete their requests first")
    shas = conn.execute(sa.select(_TABLE.c.sha256).where(_TABLE.c.location != '')).scalars().all()
    store = open_store() if shas else None
    for sha in shas:
        assert store is not None
        with store.get(sha) as blob:
            data = blob.read()
        conn.execute(sa.update(_TABLE).where(_TABLE.c.sha256 == sha).values(content=data))
        del data


def downgrade() -> None:
    op.add_column('model_artifacts', sa.Column('content', sa.LargeBinary(), nullable=False, server_default=''))
    _move_in(op.get_bind())
    _no_server_defaults('content')
    _drop('layout', 'location')

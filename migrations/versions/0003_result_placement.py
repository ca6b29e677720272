"""results placement: where each job was measured (host, slot, GPU, CPU sets) and whether it shared its host

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 11:20:00.000000
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

COLUMNS = (
    ('host', sa.String(length=255)),
    ('slot', sa.Integer()),
    ('gpu_uuid', sa.String(length=80)),
    ('server_cpus', sa.String(length=255)),
    ('loadgen_cpus', sa.String(length=255)),
    ('host_shared', sa.Boolean()),
    ('isolated', sa.Boolean()),
)


def upgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        for name, type_ in COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        for name, _ in reversed(COLUMNS):
            batch_op.drop_column(name)

"""results.cpu_steal_pct: the CPU share the hypervisor took while a job was measured

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 07:42:48.771576
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cpu_steal_pct', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.drop_column('cpu_steal_pct')

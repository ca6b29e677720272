"""results gains the prefix-cache dimension of an LLM job (issue 41 point 4): its state (cold, warm) and shared-prefix
share as facts, the hit rate the workload intends and the one the server measured, and whether they agree within
10 points; job_results shows them

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29 07:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import (
    LLM_FACTS_0014,
    LLM_FACTS_0016,
    METRICS_0014,
    METRICS_0015,
    METRICS_0016,
    PREFIX_BOOL_METRICS_0016,
    PREFIX_METRICS_0016,
    view_dropped,
)

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with view_dropped(op, METRICS_0016, LLM_FACTS_0016), op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.add_column(sa.Column('prefix_cache', sa.String(8), nullable=True))
        batch_op.add_column(sa.Column('shared_prefix_pct', sa.Float(), nullable=True))
        for name in PREFIX_METRICS_0016:
            kind = sa.Boolean() if name in PREFIX_BOOL_METRICS_0016 else sa.Float()
            batch_op.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0015, LLM_FACTS_0014), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(PREFIX_METRICS_0016):
            batch_op.drop_column(name)
        batch_op.drop_column('shared_prefix_pct')
        batch_op.drop_column('prefix_cache')

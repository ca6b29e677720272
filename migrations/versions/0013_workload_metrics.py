"""results gains the LLM workload's checks and reasoning figures (issue 41): time to first output token
percentiles, reasoning and answer tokens/s, reasoning tokens per request, the prompt and output lengths asked and
how far the server's own counts were off, the prefix-cache share and whether the workload was as asked;
job_results shows them

Revision ID: 0013_workload
Revises: 0012_model_store
Create Date: 2026-11-29 04:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import LLM_FACTS_0010, METRICS_0008, METRICS_0013, WORKLOAD_BOOL_METRICS_0013, \
    WORKLOAD_METRICS_0013, view_dropped

revision = '0013_workload'
down_revision = '0012_model_store'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with view_dropped(op, METRICS_0013, LLM_FACTS_0010), op.batch_alter_table('results', schema=None) as batch_op:
        for name in WORKLOAD_METRICS_0013:
            kind = sa.Boolean() if name in WORKLOAD_BOOL_METRICS_0013 else sa.Float()
            batch_op.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0008, LLM_FACTS_0010), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(WORKLOAD_METRICS_0013):
            batch_op.drop_column(name)

"""results gains the server's own per-request histograms (vLLM's /metrics: prefill, decode, end-to-end and
inter-token time, p50s read over the measured span: workers.loadgen.openai.server_metrics) and its prefix-cache
lookups (a counter over the windows: server_scrape); job_results shows them

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29 07:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import LLM_FACTS_0014, METRICS_0015, METRICS_0016, SERVER_METRICS_0016, view_dropped

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with view_dropped(op, METRICS_0016, LLM_FACTS_0014), op.batch_alter_table('results', schema=None) as batch_op:
        for name in SERVER_METRICS_0016:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0015, LLM_FACTS_0014), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(SERVER_METRICS_0016):
            batch_op.drop_column(name)

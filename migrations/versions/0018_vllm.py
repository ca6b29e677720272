"""results gains the server's own per-request histograms (vLLM's /metrics: decode, end-to-end and
inter-token time (its prefill came with 0017), p50s read over the measured span: workers.loadgen.openai.server_metrics) and its prefix-cache
lookups (a counter over the windows: server_scrape); job_results shows them

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29 07:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import LLM_FACTS_0016, METRICS_0017, METRICS_0018, SERVER_METRICS_0018, view_dropped

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with view_dropped(op, METRICS_0018, LLM_FACTS_0016), op.batch_alter_table('results', schema=None) as batch_op:
        for name in SERVER_METRICS_0018:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0017, LLM_FACTS_0016), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(SERVER_METRICS_0018):
            batch_op.drop_column(name)

"""results gains the server's prefill histogram p50 (``server_prefill_p50_ms``: vLLM's
``vllm:request_prefill_time_seconds``, read from its /metrics before and after the measured span), which the
reports' TTFT split (the server's queue + prefill and the rest) uses; job_results shows it

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29 07:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import LLM_FACTS_0016, METRICS_0016, METRICS_0017, SERVER_METRICS_0017, view_dropped

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with view_dropped(op, METRICS_0017, LLM_FACTS_0016), op.batch_alter_table('results', schema=None) as batch_op:
        for name in SERVER_METRICS_0017:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0016, LLM_FACTS_0016), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(SERVER_METRICS_0017):
            batch_op.drop_column(name)

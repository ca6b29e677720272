"""results gains the server's own view of an LLM job (its Prometheus /metrics scraped through the measured
windows: workers.loadgen.openai.server_scrape): requests running and waiting and KV-cache use (mean, max), prompt,
generated and cached tokens and preemptions (increases over the windows), the scrape count; and which server
program ran with its version (``server``, schemas.llm_facts); job_results shows them

Revision ID: 0014
Revises: 0013_workload
Create Date: 2026-11-29 03:40:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import (
    LLM_FACTS_0010,
    LLM_FACTS_0014,
    METRICS_0013,
    METRICS_0014,
    SERVER_INT_METRICS_0014,
    SERVER_METRICS_0014,
    view_dropped,
)

revision = '0014'
down_revision = '0013_workload'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with view_dropped(op, METRICS_0014, LLM_FACTS_0014), op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.add_column(sa.Column('server', sa.String(200), nullable=True))
        for name in SERVER_METRICS_0014:
            kind = sa.BigInteger() if name in SERVER_INT_METRICS_0014 else sa.Float()
            batch_op.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0013, LLM_FACTS_0010), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(SERVER_METRICS_0014):
            batch_op.drop_column(name)
        batch_op.drop_column('server')

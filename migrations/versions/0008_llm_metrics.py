"""results gains the generative-serving figures of the OpenAI client: TTFT, ITL and TPOT percentiles, token
rates and means, goodput under the SLO, output-limit overruns and the server's own prefill/TPOT; job_results
shows them

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 19:30:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import LLM_INT_METRICS_0008, LLM_METRICS_0008, METRICS_0007, METRICS_0008, view_dropped

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

#: the metric columns of results at this revision
METRICS = METRICS_0008


def upgrade() -> None:
    with view_dropped(op, METRICS), op.batch_alter_table('results', schema=None) as batch_op:
        for name in LLM_METRICS_0008:
            kind = sa.BigInteger() if name in LLM_INT_METRICS_0008 else sa.Float()
            batch_op.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0007), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(LLM_METRICS_0008):
            batch_op.drop_column(name)

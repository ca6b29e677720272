"""results gains a sessions workload's figures per turn (issue 41, --sessions): the time to first token p50 and
the share of prompt tokens the server served from its prefix cache of turns 1 to 8 (every turn's figures are in
the job's details); job_results shows them

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 07:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import LLM_FACTS_0014, METRICS_0014, METRICS_0015, SESSION_METRICS_0015, view_dropped

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with view_dropped(op, METRICS_0015, LLM_FACTS_0014), op.batch_alter_table('results', schema=None) as batch_op:
        for name in SESSION_METRICS_0015:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0014, LLM_FACTS_0014), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(SESSION_METRICS_0015):
            batch_op.drop_column(name)

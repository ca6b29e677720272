"""results gains the host yardstick and the foreign load: host_speed_index (pass/s), host_speed_change_pct (%),
foreign_cpu_pct (%); job_results shows them

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 10:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import HOST_METRICS_0007, METRICS_0004, METRICS_0007, view_dropped

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

#: the metric columns of results at this revision
METRICS = METRICS_0007


def upgrade() -> None:
    with view_dropped(op, METRICS), op.batch_alter_table('results', schema=None) as batch_op:
        for name in HOST_METRICS_0007:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0004), op.batch_alter_table('results', schema=None) as batch_op:
        for name in reversed(HOST_METRICS_0007):
            batch_op.drop_column(name)

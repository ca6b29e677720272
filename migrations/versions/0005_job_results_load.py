"""job_results gains the load of each job: its mode (closed|constant|poisson) and open-loop rate (req/s)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 17:00:00.000000
"""
from __future__ import annotations

from alembic import op

from farm.db.views import LOAD_0005, METRICS_0004, create_job_results

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

#: the metric columns of results at this revision: 0004's (no metric was added since)
METRICS = METRICS_0004


def upgrade() -> None:
    for statement in create_job_results(op.get_bind().dialect.name, METRICS, LOAD_0005):
        op.execute(statement)


def downgrade() -> None:
    for statement in create_job_results(op.get_bind().dialect.name, METRICS, load=()):
        op.execute(statement)

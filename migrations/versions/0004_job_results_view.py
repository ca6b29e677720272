"""job_results: a view with one row per job (request, model, every coordinate, status, placement, every metric)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 13:25:00.000000
"""
from __future__ import annotations

from alembic import op

from farm.db.views import METRICS_0004, create_job_results, drop_job_results

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

#: the metric columns of results at this revision (frozen in farm.db.views)
METRICS = METRICS_0004


def upgrade() -> None:
    for statement in create_job_results(op.get_bind().dialect.name, METRICS, load=()):
        op.execute(statement)


def downgrade() -> None:
    op.execute(drop_job_results())

"""jobs.rate: a job's open-loop rate (requests/s, NULL in closed loop) as a column, like its concurrency

Filled from each job's spec (``measurement.rate``); job_results reads the column.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 10:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import LOAD, LOAD_0005, METRICS_0004, create_job_results, drop_job_results, spec_rate_sql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

#: the metric columns of results at this revision: 0004's (no metric was added since)
METRICS = METRICS_0004


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute(drop_job_results())  # SQLite: no table a view names may be rebuilt
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rate', sa.Float(), nullable=True))
    op.execute(f"UPDATE jobs SET rate = {spec_rate_sql(dialect)}")
    for statement in create_job_results(dialect, METRICS, LOAD):
        op.execute(statement)


def downgrade() -> None:
    op.execute(drop_job_results())
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('rate')
    for statement in create_job_results(op.get_bind().dialect.name, METRICS, LOAD_0005):
        op.execute(statement)

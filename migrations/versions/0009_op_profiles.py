"""op profiles (--op-profile): tables op_profiles (one per job: status, totals, raw trace) and op_nodes (one per
graph node), and the view job_ops joining them to their jobs

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 19:40:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.op_views import drop_job_ops, job_ops_sql

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'op_profiles',
        sa.Column('job_id', sa.String(length=32), nullable=False),
        sa.Column('engine', sa.String(length=40), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('batch_size', sa.Integer(), nullable=False),
        sa.Column('threads', sa.Integer(), nullable=False),
        sa.Column('warmup', sa.Integer(), nullable=False),
        sa.Column('iterations', sa.Integer(), nullable=False),
        sa.Column('events', sa.BigInteger(), nullable=False),
        sa.Column('capped', sa.Boolean(), nullable=False),
        sa.Column('node_sum_ms', sa.Float(), nullable=True),
        sa.Column('compute_ms', sa.Float(), nullable=True),
        sa.Column('profiled_ms', sa.Float(), nullable=True),
        sa.Column('overhead_ms', sa.Float(), nullable=True),
        sa.Column('trace_format', sa.String(length=16), nullable=True),
        sa.Column('cpus', sa.String(length=255), nullable=True),
        sa.Column('trace_gz', sa.LargeBinary(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_op_profiles_job_id_jobs'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('job_id', name=op.f('pk_op_profiles')),
    )
    op.create_table(
        'op_nodes',
        sa.Column('job_id', sa.String(length=32), nullable=False),
        sa.Column('rank', sa.Integer(), nullable=False),
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('op_type', sa.String(length=120), nullable=False),
        sa.Column('exec_type', sa.String(length=120), nullable=False),
        sa.Column('provider', sa.String(length=60), nullable=False),
        sa.Column('calls', sa.Float(), nullable=False),
        sa.Column('self_ms_p50', sa.Float(), nullable=False),
        sa.Column('self_ms_p90', sa.Float(), nullable=False),
        sa.Column('share', sa.Float(), nullable=False),
        sa.Column('input_shapes', sa.Text(), nullable=False),
        sa.Column('fused', sa.JSON(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['op_profiles.job_id'], name=op.f('fk_op_nodes_job_id_op_profiles'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('job_id', 'rank', name=op.f('pk_op_nodes')),
    )
    op.create_index(op.f('ix_op_nodes_op_type'), 'op_nodes', ['op_type'], unique=False)
    op.execute(job_ops_sql())


def downgrade() -> None:
    op.execute(drop_job_ops())
    op.drop_index(op.f('ix_op_nodes_op_type'), table_name='op_nodes')
    op.drop_table('op_nodes')
    op.drop_table('op_profiles')

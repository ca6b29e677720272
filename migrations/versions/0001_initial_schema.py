"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 05:58:45.591517
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('model_artifacts',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('filename', sa.String(length=255), nullable=False),
    sa.Column('format', sa.String(length=32), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('content', sa.LargeBinary(), nullable=False),
    sa.Column('inputs', sa.JSON(), nullable=False),
    sa.Column('static_metrics', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name=op.f('pk_model_artifacts'))
    )
    op.create_table('workers',
    sa.Column('id', sa.String(length=120), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('hardware', sa.JSON(), nullable=False),
    sa.Column('queues', sa.JSON(), nullable=False),
    sa.Column('runner', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_heartbeat', sa.DateTime(timezone=True), nullable=False),
    sa.Column('current_job_id', sa.String(length=32), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workers'))
    )
    op.create_table('requests',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('model_sha256', sa.String(length=64), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('excluded', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['model_sha256'], ['model_artifacts.sha256'], name=op.f('fk_requests_model_sha256_model_artifacts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_requests'))
    )
    with op.batch_alter_table('requests', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_requests_created_at'), ['created_at'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('request_id', sa.String(length=36), nullable=False),
    sa.Column('device', sa.String(length=80), nullable=False),
    sa.Column('engine', sa.String(length=32), nullable=False),
    sa.Column('batch_size', sa.Integer(), nullable=False),
    sa.Column('concurrency', sa.Integer(), nullable=False),
    sa.Column('edge_profile', sa.String(length=64), nullable=True),
    sa.Column('queue', sa.String(length=120), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('worker_id', sa.String(length=120), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['request_id'], ['requests.id'], name=op.f('fk_jobs_request_id_requests'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_request_id_status'), ['request_id', 'status'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_status_queue'), ['status', 'queue'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_worker_id'), ['worker_id'], unique=False)

    op.create_table('results',
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('request_id', sa.String(length=36), nullable=False),
    sa.Column('worker_id', sa.String(length=120), nullable=True),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('throughput_infer_per_s', sa.Float(), nullable=True),
    sa.Column('requests_per_s', sa.Float(), nullable=True),
    sa.Column('latency_mean_ms', sa.Float(), nullable=True),
    sa.Column('latency_p50_ms', sa.Float(), nullable=True),
    sa.Column('latency_p90_ms', sa.Float(), nullable=True),
    sa.Column('latency_p95_ms', sa.Float(), nullable=True),
    sa.Column('latency_p99_ms', sa.Float(), nullable=True),
    sa.Column('latency_p999_ms', sa.Float(), nullable=True),
    sa.Column('latency_max_ms', sa.Float(), nullable=True),
    sa.Column('latency_std_ms', sa.Float(), nullable=True),
    sa.Column('server_queue_p50_ms', sa.Float(), nullable=True),
    sa.Column('server_compute_p50_ms', sa.Float(), nullable=True),
    sa.Column('server_compute_p99_ms', sa.Float(), nullable=True),
    sa.Column('error_count', sa.BigInteger(), nullable=True),
    sa.Column('late_send_pct', sa.Float(), nullable=True),
    sa.Column('client_busy_pct', sa.Float(), nullable=True),
    sa.Column('stable', sa.Boolean(), nullable=True),
    sa.Column('windows', sa.BigInteger(), nullable=True),
    sa.Column('gpu_mem_peak_bytes', sa.BigInteger(), nullable=True),
    sa.Column('gpu_util_avg_pct', sa.Float(), nullable=True),
    sa.Column('gpu_power_avg_w', sa.Float(), nullable=True),
    sa.Column('cpu_pct_avg', sa.Float(), nullable=True),
    sa.Column('cpu_pct_peak', sa.Float(), nullable=True),
    sa.Column('mem_avg_bytes', sa.BigInteger(), nullable=True),
    sa.Column('mem_peak_bytes', sa.BigInteger(), nullable=True),
    sa.Column('mem_limit_bytes', sa.BigInteger(), nullable=True),
    sa.Column('cpu_limit', sa.Float(), nullable=True),
    sa.Column('oom_killed', sa.Boolean(), nullable=True),
    sa.Column('limits_enforced', sa.Boolean(), nullable=True),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('total_time_s', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_results_job_id_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['request_id'], ['requests.id'], name=op.f('fk_results_request_id_requests'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', name=op.f('pk_results'))
    )
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_results_request_id'), ['request_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_results_request_id'))

    op.drop_table('results')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_worker_id'))
        batch_op.drop_index(batch_op.f('ix_jobs_status_queue'))
        batch_op.drop_index(batch_op.f('ix_jobs_request_id_status'))

    op.drop_table('jobs')
    with op.batch_alter_table('requests', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_requests_created_at'))

    op.drop_table('requests')
    op.drop_table('workers')
    op.drop_table('model_artifacts')

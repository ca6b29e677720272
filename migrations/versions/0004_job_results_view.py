"""job_results: a view with one row per job (request, model, every coordinate, status, placement, every metric)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 13:25:00.000000
"""
from __future__ import annotations

from alembic import op

from farm.db.views import create_job_results, drop_job_results

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

#: the metric columns of results at this revision (frozen: a migration adding a metric recreates the view)
METRICS = (
    'throughput_infer_per_s', 'requests_per_s', 'latency_mean_ms', 'latency_p50_ms', 'latency_p90_ms',
    'latency_p95_ms', 'latency_p99_ms', 'latency_p999_ms', 'latency_max_ms', 'latency_std_ms',
    'server_queue_p50_ms', 'server_compute_p50_ms', 'server_compute_p99_ms', 'error_count', 'late_send_pct',
    'client_busy_pct', 'stable', 'windows', 'gpu_mem_peak_bytes', 'gpu_util_avg_pct', 'gpu_power_avg_w',
    'cpu_steal_pct', 'cpu_pct_avg', 'cpu_pct_peak', 'mem_avg_bytes', 'mem_peak_bytes', 'mem_limit_bytes',
    'cpu_limit', 'oom_killed', 'limits_enforced', 'duration_s', 'total_time_s',
)


def upgrade() -> None:
    for statement in create_job_results(op.get_bind().dialect.name, METRICS):
        op.execute(statement)


def downgrade() -> None:
    op.execute(drop_job_results())

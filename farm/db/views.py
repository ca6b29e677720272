"""The SQL view ``job_results``: one row per job with its request, model, every coordinate, status, how and
where it was measured, and every metric column, for analysts who query farm with SQL.

Migrations create it with :func:`create_job_results` and a frozen list of metric columns. A later migration
that adds a metric, or that rebuilds ``jobs``/``results``/``requests`` on SQLite (a batch operation that copies the
table: SQLite refuses to rename a table a view names), runs inside :func:`view_dropped`, which drops the view and
creates it again afterwards with the metric list it is given.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

VIEW = "job_results"
#: the serving dimensions each job keeps in ``jobs.spec -> 'measurement'`` (integers; NULL when absent)
SPEC_DIMENSIONS = ("instances", "threads", "max_queue_delay_us", "preferred_batch_size")
#: the placement columns of ``results`` (``schemas.Placement``), frozen here as the view's SQL needs them
PLACEMENT = ("host", "slot", "gpu_uuid", "server_cpus", "loadgen_cpus", "host_shared", "isolated")
MEASURED_SERVING = "end-to-end over gRPC"
MEASURED_EDGE = "in-process (no transport)"


def _json_text(dialect: str, column: str, *path: str) -> str:
    """SQL for the text at ``path`` inside the JSON ``column`` (NULL when absent)."""
    if dialect == "postgresql":
        return f"({column}::jsonb #>> '{{{','.join(path)}}}')"
    return f"json_extract({column}, '$.{'.'.join(path)}')"


def job_results_sql(dialect: str, metrics: Sequence[str]) -> str:
    """``CREATE VIEW job_results`` for ``dialect`` (``postgresql`` or ``sqlite``) with ``metrics`` columns."""
    dims = ",\n  ".join(f"CAST({_json_text(dialect, 'j.spec', 'measurement', d)} AS INTEGER) AS {d}"
                        for d in SPEC_DIMENSIONS)
    rpc = f"COALESCE({_json_text(dialect, 'j.spec', 'measurement', 'rpc')}, 'unary')"
    cols = ",\n  ".join(f"r.{c}" for c in (*PLACEMENT, *metrics))
    return f"""CREATE VIEW {VIEW} AS SELECT
  j.request_id, q.name AS request_name, {_json_text(dialect, 'q.spec', 'model')} AS model, q.model_sha256,
  j.id AS job_id, j.device, j.engine, j.batch_size, j.concurrency, j.edge_profile, {rpc} AS rpc,
  {dims},
  j.status, j.attempts, j.worker_id, j.error, j.created_at, j.finished_at,
  CASE WHEN j.edge_profile IS NULL THEN '{MEASURED_SERVING}' ELSE '{MEASURED_EDGE}' END AS measured,
  {cols}
FROM jobs j
JOIN requests q ON q.id = j.request_id
LEFT JOIN results r ON r.job_id = j.id"""


def create_job_results(dialect: str, metrics: Sequence[str]) -> list[str]:
    """The statements that (re)create the view: drop it if present, then create it."""
    return [drop_job_results(), job_results_sql(dialect, metrics)]


def drop_job_results() -> str:
    return f"DROP VIEW IF EXISTS {VIEW}"


@contextmanager
def view_dropped(op: Any, metrics: Sequence[str]) -> Iterator[None]:
    """Inside a migration (``op``: ``alembic.op``): drop ``job_results``, run the block, create it again with
    ``metrics`` columns."""
    op.execute(drop_job_results())
    yield
    for statement in create_job_results(op.get_bind().dialect.name, metrics):
        op.execute(statement)

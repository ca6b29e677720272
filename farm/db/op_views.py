"""The SQL view ``job_ops``: one row per node of every job's op profile (``op_nodes``) joined to its job
(request, engine, device, batch, edge profile) and profile (totals, status), plus one ``(overhead)`` row per
profile (compute time no node accounts for). The same SQL serves Postgres and SQLite (migration 0009)."""
from __future__ import annotations

from schemas.op_profile import OVERHEAD

VIEW = "job_ops"

_JOB = ("j.request_id, j.id AS job_id, j.engine, j.device, j.batch_size, j.concurrency, j.edge_profile, "
        "p.status AS profile_status, p.reason AS profile_reason, p.iterations, p.node_sum_ms, p.compute_ms, "
        "p.overhead_ms")


def job_ops_sql() -> str:
    """``CREATE VIEW job_ops`` (Postgres and SQLite)."""
    return f"""CREATE VIEW {VIEW} AS
SELECT {_JOB}, n.rank, n.name AS node, n.op_type, n.exec_type, n.provider, n.calls, n.self_ms_p50,
  n.self_ms_p90, n.share, n.input_shapes, n.status AS node_status
FROM op_nodes n
JOIN op_profiles p ON p.job_id = n.job_id
JOIN jobs j ON j.id = n.job_id
UNION ALL
SELECT {_JOB}, -1 AS rank, '{OVERHEAD}' AS node, '{OVERHEAD}' AS op_type, '' AS exec_type, '' AS provider,
  1.0 AS calls, p.overhead_ms AS self_ms_p50, NULL AS self_ms_p90, NULL AS share, '' AS input_shapes,
  'overhead' AS node_status
FROM op_profiles p
JOIN jobs j ON j.id = p.job_id
WHERE p.status = 'ok'"""


def drop_job_ops() -> str:
    return f"DROP VIEW IF EXISTS {VIEW}"

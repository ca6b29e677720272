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

from schemas.measured import LLM_RPC, MEASURED_EDGE, MEASURED_LLM, MEASURED_LLM_EDGE, MEASURED_SERVING

VIEW = "job_results"
#: the serving dimensions each job keeps in ``jobs.spec -> 'measurement'`` (integers; NULL when absent)
SPEC_DIMENSIONS = ("instances", "threads", "max_queue_delay_us", "preferred_batch_size")
#: the placement columns of ``results`` (``schemas.Placement``), frozen here as the view's SQL needs them
PLACEMENT = ("host", "slot", "gpu_uuid", "server_cpus", "loadgen_cpus", "host_shared", "isolated")
#: the load columns: the job's ``measurement`` mode (closed|constant|poisson) and open-loop rate (requests/s,
#: NULL in closed loop), read from the ``jobs.rate`` column (migration 0006)
LOAD = ("mode", "rate")
#: the load columns as migration 0005 froze them: the rate read from ``jobs.spec`` (no ``jobs.rate`` yet)
LOAD_0005 = ("mode", "spec_rate")
#: the metric columns of results at migration 0004, frozen (a migration adding a metric recreates the view
#: with its own list)
METRICS_0004 = (
    'throughput_infer_per_s', 'requests_per_s', 'latency_mean_ms', 'latency_p50_ms', 'latency_p90_ms',
    'latency_p95_ms', 'latency_p99_ms', 'latency_p999_ms', 'latency_max_ms', 'latency_std_ms',
    'server_queue_p50_ms', 'server_compute_p50_ms', 'server_compute_p99_ms', 'error_count', 'late_send_pct',
    'client_busy_pct', 'stable', 'windows', 'gpu_mem_peak_bytes', 'gpu_util_avg_pct', 'gpu_power_avg_w',
    'cpu_steal_pct', 'cpu_pct_avg', 'cpu_pct_peak', 'mem_avg_bytes', 'mem_peak_bytes', 'mem_limit_bytes',
    'cpu_limit', 'oom_killed', 'limits_enforced', 'duration_s', 'total_time_s',
)
#: the metric columns migration 0007 added (the host yardstick and the foreign load on the job's cores)
HOST_METRICS_0007 = ('host_speed_index', 'host_speed_change_pct', 'foreign_cpu_pct')
#: the metric columns of results at migration 0007, frozen
METRICS_0007 = METRICS_0004 + HOST_METRICS_0007
#: the metric columns migration 0008 added (generative serving: the OpenAI client's figures)
LLM_METRICS_0008 = (
    'ttft_p50_ms', 'ttft_p90_ms', 'ttft_p99_ms', 'itl_p50_ms', 'itl_p90_ms', 'itl_p99_ms', 'tpot_p50_ms',
    'tpot_p90_ms', 'tpot_p99_ms', 'output_tokens_per_s', 'output_tokens_per_s_per_user', 'input_tokens_per_s',
    'mean_input_tokens', 'mean_output_tokens', 'goodput_req_per_s', 'output_overrun_count', 'server_ttft_p50_ms',
    'server_tpot_p50_ms',
)
#: the integer ones among them
LLM_INT_METRICS_0008 = ('output_overrun_count',)
#: the metric columns of results at migration 0008, frozen
METRICS_0008 = METRICS_0007 + LLM_METRICS_0008
#: the metric columns migration 0013 added (issue 41: reasoning, time to first output token, the workload's checks)
WORKLOAD_METRICS_0013 = (
    'ttfot_p50_ms', 'ttfot_p90_ms', 'ttfot_p99_ms', 'reasoning_tokens_per_s', 'answer_tokens_per_s',
    'mean_reasoning_tokens', 'requested_input_tokens_mean', 'requested_output_tokens_mean', 'input_tokens_off_pct',
    'output_tokens_off_pct', 'cached_prompt_tokens_pct', 'workload_as_asked',
)
#: the boolean ones among them
WORKLOAD_BOOL_METRICS_0013 = ('workload_as_asked',)
#: the metric columns of results at migration 0013, frozen
METRICS_0013 = METRICS_0008 + WORKLOAD_METRICS_0013
#: the LLM job's facts migration 0010 added to results (``schemas.llm_facts``: knobs as JSON, then scalars), frozen
LLM_FACTS_0010 = ('knobs', 'n_threads', 'tokenizer', 'token_source', 'input_tokens', 'output_tokens',
                  'prefix_tokens', 'workload_seed', 'prompts')
#: the server's own view migration 0014 added (its /metrics through the windows: ``server_scrape``), frozen
SERVER_METRICS_0014 = (
    'server_requests_running_mean', 'server_requests_running_max', 'server_requests_waiting_mean',
    'server_requests_waiting_max', 'server_kv_cache_usage_mean_pct', 'server_kv_cache_usage_max_pct',
    'server_prompt_tokens', 'server_generation_tokens', 'server_cached_prompt_tokens', 'server_preemptions',
    'server_scrapes',
)
#: the integer ones among them
SERVER_INT_METRICS_0014 = ('server_scrapes',)
#: the metric columns of results at migration 0014, frozen
METRICS_0014 = METRICS_0013 + SERVER_METRICS_0014
#: the LLM job's facts at migration 0014: which server program ran and its version (``server``) added
LLM_FACTS_0014 = LLM_FACTS_0010 + ('server',)
#: the metric columns migration 0015 added (issue 41: sessions, TTFT and the prefix-cache share per turn 1-8),
#: frozen (``schemas.metrics.TURN_METRICS`` turns)
SESSION_METRICS_0015 = tuple(f'turn{k}_{fig}' for k in range(1, 9)
                             for fig in ('ttft_p50_ms', 'cached_prompt_tokens_pct'))
#: the metric columns of results at migration 0015, frozen
METRICS_0015 = METRICS_0014 + SESSION_METRICS_0015
#: the prefix-cache metrics migration 0016 added (issue 41 point 4: intended and measured hit rates), frozen
PREFIX_METRICS_0016 = ('prefix_hit_intended_pct', 'prefix_hit_pct', 'prefix_hit_as_intended')
#: the boolean ones among them
PREFIX_BOOL_METRICS_0016 = ('prefix_hit_as_intended',)
#: the metric columns of results at migration 0016, frozen
METRICS_0016 = METRICS_0015 + PREFIX_METRICS_0016
#: the LLM job's facts at migration 0016: its prefix-cache state and shared-prefix share added
LLM_FACTS_0016 = LLM_FACTS_0014 + ('prefix_cache', 'shared_prefix_pct')
#: the metric column migration 0017 added: the server's prefill histogram p50 (vLLM's; the TTFT split of the
#: reports: ``farm.readers.ttft_split``), frozen
SERVER_METRICS_0017 = ('server_prefill_p50_ms',)
#: the metric columns of results at migration 0017, frozen
METRICS_0017 = METRICS_0016 + SERVER_METRICS_0017
#: the server's histograms and prefix-cache lookups migration 0018 added (vLLM's: ``server_metrics``; its prefill p50
#: came with 0017), frozen
SERVER_METRICS_0018 = ('server_decode_p50_ms', 'server_e2e_p50_ms', 'server_itl_p50_ms', 'server_prefix_cache_queries')
#: the metric columns of results at migration 0018, frozen
METRICS_0018 = METRICS_0017 + SERVER_METRICS_0018


def _json_text(dialect: str, column: str, *path: str) -> str:
    """SQL for the text at ``path`` inside the JSON ``column`` (NULL when absent)."""
    if dialect == "postgresql":
        return f"({column}::jsonb #>> '{{{','.join(path)}}}')"
    return f"json_extract({column}, '$.{'.'.join(path)}')"


def _sql_text(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def spec_rate_sql(dialect: str, column: str = "spec") -> str:
    """SQL for the open-loop rate a job's spec JSON (``column``) holds, requests/s (NULL in closed loop): what
    ``jobs.rate`` was filled from (migration 0006)."""
    real = "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    return f"CAST({_json_text(dialect, column, 'measurement', 'rate')} AS {real})"


def _load_sql(dialect: str, load: Sequence[str]) -> str:
    """The select-list entries of the ``load`` columns (:data:`LOAD`, :data:`LOAD_0005` or none, as a migration
    froze it)."""
    sql = {"mode": f"COALESCE({_json_text(dialect, 'j.spec', 'measurement', 'mode')}, 'closed') AS mode",
           "spec_rate": f"{spec_rate_sql(dialect, 'j.spec')} AS rate",
           "rate": "j.rate AS rate"}
    return "".join(f" {sql[c]}," for c in load)


def job_results_sql(dialect: str, metrics: Sequence[str], load: Sequence[str] = LOAD,
                    facts: Sequence[str] = ()) -> str:
    """``CREATE VIEW job_results`` for ``dialect`` (``postgresql`` or ``sqlite``) with ``metrics`` columns,
    the ``load`` columns and the LLM ``facts`` columns of results (:data:`LLM_FACTS_0010` or none)."""
    dims = ",\n  ".join(f"CAST({_json_text(dialect, 'j.spec', 'measurement', d)} AS INTEGER) AS {d}"
                        for d in SPEC_DIMENSIONS)
    llm = _json_text(dialect, 'j.spec', 'measurement', 'llm')  # an LLM job: the OpenAI client's server-sent events
    rpc = (f"CASE WHEN {llm} IS NOT NULL THEN {_sql_text(LLM_RPC)} "
           f"ELSE COALESCE({_json_text(dialect, 'j.spec', 'measurement', 'rpc')}, 'unary') END")
    before, after = (_sql_text(part) for part in MEASURED_SERVING.split("{rpc}"))
    cols = ",\n  ".join(f"r.{c}" for c in (*PLACEMENT, *facts, *metrics))
    # from 0010 (facts given): an LLM engine's edge run is served over HTTP under the limits, said so
    llm_edge = (f"WHEN j.edge_profile IS NOT NULL AND {llm} IS NOT NULL THEN {_sql_text(MEASURED_LLM_EDGE)}\n       "
                if facts else "")
    return f"""CREATE VIEW {VIEW} AS SELECT
  j.request_id, q.name AS request_name, {_json_text(dialect, 'q.spec', 'model')} AS model, q.model_sha256,
  j.id AS job_id, j.device, j.engine, j.batch_size, j.concurrency,{_load_sql(dialect, load)} j.edge_profile,
  {rpc} AS rpc,
  {dims},
  j.status, j.attempts, j.worker_id, j.error, j.created_at, j.finished_at,
  CASE {llm_edge}WHEN j.edge_profile IS NOT NULL THEN {_sql_text(MEASURED_EDGE)}
       WHEN {llm} IS NOT NULL THEN {_sql_text(MEASURED_LLM)} ELSE {before} || {rpc} || {after} END AS measured,
  {cols}
FROM jobs j
JOIN requests q ON q.id = j.request_id
LEFT JOIN results r ON r.job_id = j.id"""


def create_job_results(dialect: str, metrics: Sequence[str], load: Sequence[str] = LOAD,
                       facts: Sequence[str] = ()) -> list[str]:
    """The statements that (re)create the view: drop it if present, then create it."""
    return [drop_job_results(), job_results_sql(dialect, metrics, load, facts)]


def drop_job_results() -> str:
    return f"DROP VIEW IF EXISTS {VIEW}"


@contextmanager
def view_dropped(op: Any, metrics: Sequence[str], facts: Sequence[str] = ()) -> Iterator[None]:
    """Inside a migration (``op``: ``alembic.op``): drop ``job_results``, run the block, create it again with
    ``metrics`` columns (and the LLM ``facts`` columns, from migration 0010)."""
    op.execute(drop_job_results())
    yield
    for statement in create_job_results(op.get_bind().dialect.name, metrics, facts=facts):
        op.execute(statement)

"""Rendering results, status and workers with Rich (table), CSV or JSON."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from farm.db.models import utcnow
from farm.errors import RequestError

# farm.formatting: shared with the reports; to_csv and to_json are re-exported for the CLI's commands
from farm.formatting import fmt_value, knobs_text, rate_text, safe_text
from farm.formatting import to_csv as to_csv
from farm.formatting import to_json as to_json
from farm.payloads import RequestSummary, WorkerRow
from farm.readers.results import llm_rows
from farm.readers.rows import ResultRow, as_row, as_rows
from farm.settings import get_settings
from farm.steal import steal_note
from schemas.hardware import SlotJson
from schemas.llm_facts import LLM_FACT_COLUMNS, SESSIONS_MARK
from schemas.measured import MEASURED_EDGE
from schemas.metrics import BY_NAME, JOB_METRICS, TURN_METRICS
from schemas.result import (
    SHARED_NOTE,
    client_limited,
    client_limited_note,
    host_flags,
    host_notes,
    shared_unisolated,
)
from schemas.worker import WorkerStatus

SHARED_MARK = "!"  # after a job id: measured beside another farm job without core isolation
CLIENT_LIMITED_MARK = "~"  # after a job id: open-loop run whose own late sends exceeded the limit

#: piped output's width when COLUMNS does not say (a terminal keeps its own; Rich reads COLUMNS itself)
PIPE_WIDTH = 140


def _console(stderr: bool = False) -> Console:
    tty = (sys.stderr if stderr else sys.stdout).isatty()
    return Console(stderr=stderr, width=None if tty or os.environ.get("COLUMNS") else PIPE_WIDTH)


#: the CLI's consoles
console = _console()
err_console = _console(stderr=True)

#: the default results table's metrics (fits 80 columns); headers are the registry's short labels (Metric.label)
TABLE_METRICS: tuple[str, ...] = ("throughput_infer_per_s", "latency_p50_ms", "latency_p99_ms", "stable")
#: ``--wide``: these metrics too, each only where some row measured it; every metric is in csv/json/parquet
WIDE_METRICS: tuple[str, ...] = (
    "throughput_infer_per_s", "requests_per_s", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
    "server_queue_p50_ms", "server_compute_p50_ms", "stable", "windows", "error_count", "cpu_pct_avg",
    "mem_peak_bytes", "gpu_util_avg_pct", "gpu_mem_peak_bytes", "gpu_power_avg_w", "late_send_pct",
)
#: the results table of LLM rows (the OpenAI client's), in place of ``TABLE_METRICS`` and ``WIDE_METRICS``
LLM_TABLE_METRICS: tuple[str, ...] = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms")
LLM_WIDE_METRICS: tuple[str, ...] = (
    "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "tpot_p50_ms", "latency_p50_ms",
    "goodput_req_per_s", "requests_per_s", "error_count", "cpu_pct_avg", "mem_peak_bytes", "gpu_util_avg_pct",
    "gpu_mem_peak_bytes", "gpu_power_avg_w",
    # the server's own view (its /metrics through the windows), where it has one
    "server_requests_running_max", "server_requests_waiting_max", "server_kv_cache_usage_max_pct",
    "server_generation_tokens",
    # sessions (--sessions): the first and second turn's TTFT and prefix-cache share (every turn: turn_lines)
    "turn1_ttft_p50_ms", "turn2_ttft_p50_ms", "turn1_cached_prompt_tokens_pct", "turn2_cached_prompt_tokens_pct",
    # its own per-request histograms (vLLM's): TTFT, and the queue and prefill parts of it
    "server_ttft_p50_ms", "server_queue_p50_ms", "server_prefill_p50_ms",
)
#: metrics whose range over a cell's runs the table shows beside the median (``farm.readers.results.merge_repeats``)
RANGE_METRICS = ("throughput_infer_per_s", "latency_p50_ms")
#: the load client, short, in the results table (``-``: an edge row, or not measured yet)
CLIENT_LABELS = {"farm": "farm", "perf_analyzer": "pa", "openai": "openai"}


def say(text: str, style: str | None = None, to: Console | None = None, soft_wrap: bool = False) -> None:
    """Print a line that holds user strings (names, paths, stored errors) literally (``safe_text``: no markup,
    control characters escaped), in ``style`` when given, on ``to`` (default: stdout's console)."""
    (to or console).print(safe_text(text, style or ""), highlight=False, soft_wrap=soft_wrap)


def safe_row(table: Table, *cells: object) -> None:
    """Add a table row whose text cells may hold user strings: each shown literally (``safe_text``); Rich
    renderables (a styled ``Text``) are added as they are."""
    table.add_row(*(c if isinstance(c, Text) else safe_text(c) for c in cells))


def results_table(rows: list[ResultRow], title: str = "", metrics: tuple[str, ...] | None = None,
                  wide: bool = False) -> Table:
    """The results as a Rich table; errors are listed under it (see ``error_lines``). ``title`` and the
    cells are shown literally. By default it fits 80 columns: the job, its coordinates and ``TABLE_METRICS``
    (status, edge and serving columns only where they say something); ``wide`` adds the client, every column
    and ``WIDE_METRICS``; ``metrics`` (``parse_columns``) replaces the metric columns. Headers are the
    registry's short labels with units. Rows merged over repeats (``farm.readers.results.merge_repeats``) get an ``n``
    column (their runs) and their spread beside the median (``metric_cell``)."""
    rows = as_rows(rows)
    table = Table(title=safe_text(title) if title else None, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    if metrics is None:
        base, more = (LLM_TABLE_METRICS, LLM_WIDE_METRICS) if llm_rows(rows) else (TABLE_METRICS, WIDE_METRICS)
        metrics = tuple(n for n in more if n in base or any(r.get(n) is not None for r in rows)) if wide else base
    cells = _identity_columns(rows, wide)
    for col in cells:
        table.add_column(col, no_wrap=True, overflow="ellipsis")
    for name in metrics:
        label = BY_NAME[name].label if name in BY_NAME else name
        table.add_column(label, justify="right", no_wrap=True, min_width=len(label))
    for r in rows:
        safe_row(table, *(cells[c](r) for c in cells), *(metric_cell(r, n) for n in metrics))
    return table


def _identity_columns(rows: list[ResultRow], wide: bool) -> dict[str, Callable[[ResultRow], object]]:
    """The results table's columns before its metrics, each with how to fill it from a row; the serving,
    edge, status and ``n`` columns only where some row needs them (all but ``n`` in the wide table)."""
    cols: dict[str, Callable[[ResultRow], object]] = {"job": job_label, "device": lambda r: r["device"],
                                                      "engine": lambda r: r["engine"]}
    if wide or any(serving_label(r) != "-" for r in rows):  # a serving dimension varies
        cols["serving"] = serving_label
    cols["b x c"] = load_label
    if wide or any(r.is_edge for r in rows):
        cols["edge"] = lambda r: r["edge_profile"] or "-"
    if any(r.get("knobs") for r in rows):  # an LLM engine's settings, as its server ran (n_threads included)
        cols["knobs"] = lambda r: knobs_text(r.get("knobs"))
    if any(r.get("prefix_cache") == "warm" for r in rows):  # the prefix-cache dimension (cold alone: not shown)
        cols["cache"] = lambda r: r.get("prefix_cache") or "-"
    if wide and llm_rows(rows):
        cols["workload"] = workload_label
        cols["tokens by"] = lambda r: r.get("token_source") or "-"
        cols["model"] = lambda r: (r.get("model_sha256") or "-")[:12]
    if wide:
        cols["client"] = client_label
    if wide or any(not r.succeeded for r in rows):
        cols["status"] = lambda r: r["status"]
    if any((r.get("repeats") or 0) > 1 for r in rows):
        cols["n"] = lambda r: str(r.get("repeats", 1))
    return cols


def workload_label(r: ResultRow) -> str:
    """An LLM row's workload: ``in 128 out 64 prefix 32 seed 0`` or ``prompts FILE out 64 seed 0``."""
    llm = as_row(r).llm
    if llm is None or llm.output_tokens is None:
        return "-"
    head = f"prompts {Path(str(llm.prompts)).name}" if llm.prompts else f"in {llm.input_tokens}"
    if str(llm.prompts).startswith(SESSIONS_MARK):
        head = str(llm.prompts)
    prefix = f" prefix {llm.prefix_tokens}" if llm.prefix_tokens else ""
    return f"{head} out {llm.output_tokens}{prefix} seed {llm.workload_seed}"


#: the metric labels ``--columns`` takes besides metric names (``Metric.label``, case-insensitive)
_BY_LABEL = {m.label.lower(): m.name for m in JOB_METRICS}
#: the other columns ``--columns`` takes: an LLM job's facts (``schemas.llm_facts``) and the model file's hash
FACT_COLUMNS = (*LLM_FACT_COLUMNS, "model_sha256")


def parse_columns(text: str) -> tuple[str, ...]:
    """``--columns a,b,c``: metric names or their short labels (``p99 ms``, ``infer/s``), or an LLM row's facts
    (:data:`FACT_COLUMNS`: ``knobs``, ``n_threads``, ``tokenizer``, ...) -> column names, in the order given;
    RequestError naming the unknown one and where the names are listed."""
    names = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name = (part if (part in BY_NAME and BY_NAME[part].scope == "job") or part in FACT_COLUMNS
                else _BY_LABEL.get(part.lower()))
        if name is None:
            raise RequestError(f"--columns: {part!r} is neither a result metric nor its label (nor an LLM row's "
                               f"fact: {', '.join(FACT_COLUMNS)}); e.g. throughput_infer_per_s,latency_p99_ms or "
                               "'infer/s,p99 ms' (docs/cli.md lists them)")
        names.append(name)
    if not names:
        raise RequestError("--columns needs at least one metric, e.g. --columns infer/s,p99 ms")
    return tuple(names)


def headline(row: ResultRow) -> Text:
    """One finished job in a line, as it lands: its configuration, throughput, p50 and p99 latency, and
    whether it was stable (or why not: unstable windows, a drifting or busy host), or its error."""
    row = as_row(row)
    head = f"{job_label(row)} {row.device} {row.engine} {load_label(row)}"
    if row.is_edge:
        head += f" edge {row.edge_profile}"
    serving = serving_label(row)
    head += "" if serving == "-" else f" {serving}"
    if not row.succeeded:
        error = " ".join(str(row.error or "no result").split())
        return Text.assemble(("✗ ", "red"), safe_text(f"{head}  {row.status}: {error[:160]}"))
    names = LLM_HEADLINE_METRICS if llm_rows([row]) else HEADLINE_METRICS
    figures = [f"{fmt_value(n, row.get(n))} {BY_NAME[n].unit}" if i == 0  # the rate, then labelled latencies
               else f"{BY_NAME[n].label.split()[0]} {fmt_value(n, row.get(n))} {BY_NAME[n].unit}"
               for i, n in enumerate(names)]
    s = get_settings()
    flags = host_flags(row, s.host_drift_pct, s.host_busy_pct)
    stable = row.get("stable")
    verdict = "stable" if stable else "stability not judged" if stable is None else "unstable"
    if stable is False:  # the last windows disagreed beyond the stability bound when the windows ran out
        verdict += f" after {row.get('windows') or '?'} windows"
    if flags:
        verdict += f"; host {', '.join(flags)}"
    style = "green" if stable and not flags else "yellow"
    return Text.assemble(("✓ ", "green"), safe_text(f"{head}  {'  '.join(figures)}  "), (verdict, style))


#: the figures of a job's headline line (``headline``): a rate first, then latencies; LLM rows their own
HEADLINE_METRICS = ("throughput_infer_per_s", "latency_p50_ms", "latency_p99_ms")
LLM_HEADLINE_METRICS = ("output_tokens_per_s", "ttft_p50_ms", "itl_p50_ms")


def jobs_table(jobs: list[Any], title: str) -> Table:
    """A request's jobs before they run (``farm submit --dry-run``): ``JobSpec``s, one line each."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    states = [j.measurement.llm.cache_state if j.measurement.llm is not None else "-" for j in jobs]
    cache = "warm" in states  # the prefix-cache dimension: shown where a job is warm
    for col in ("#", "device", "engine", "serving", "b x c", "edge", *(("cache",) if cache else ()), "run"):
        table.add_column(col, no_wrap=True, overflow="ellipsis")
    for i, (j, state) in enumerate(zip(jobs, states, strict=True), 1):
        row = {"batch_size": j.batch_size, "concurrency": j.concurrency, "rate": j.rate,
               "edge_profile": (j.edge_profile.name or "edge") if j.edge_profile else None,
               **j.measurement.model_dump(include={"instances", "threads", "max_queue_delay_us",
                                                   "preferred_batch_size"})}
        safe_row(table, str(i), j.device, j.engine, serving_label(row), load_label(row), row["edge_profile"] or "-",
                 *((state,) if cache else ()), str(j.repeat + 1))
    return table


def status_table(rows: list[ResultRow], times: dict[str, tuple[datetime | None, datetime | None]],
                 title: str) -> Table:
    """``farm status ID``: each job's state, coordinates and time running (so far, or in all), with its
    throughput and p99 once measured."""
    table = Table(title=safe_text(title), box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    serving = any(serving_label(r) != "-" for r in rows)
    for col in ("job", "state", "device", "engine", *(("serving",) if serving else ()), "b x c", "elapsed"):
        table.add_column(col, no_wrap=True, overflow="ellipsis")
    metrics = ("throughput_infer_per_s", "latency_p99_ms")
    for name in metrics:
        table.add_column(BY_NAME[name].label, justify="right", no_wrap=True)
    for r in rows:
        started, finished = times.get(r["job_id"], (None, None))
        safe_row(table, job_label(r), r["status"], r["device"], r["engine"],
                 *((serving_label(r),) if serving else ()), load_label(r), elapsed(started, finished),
                 *(metric_cell(r, n) for n in metrics))
    return table


def requests_table(reqs: list[RequestSummary]) -> Table:
    """``farm status``: the recent requests, newest first, with their job counts (``-1`` is the first row)."""
    table = Table(title="recent requests (newest first: latest = -1, then -2, ...)", box=box.SIMPLE_HEAD,
                  pad_edge=False, padding=(0, 1))
    for col in ("#", "request", "name", "model", "created", "jobs"):
        table.add_column(col, overflow="ellipsis", no_wrap=col in ("#", "request", "created"))
    for i, r in enumerate(reqs, 1):
        safe_row(table, f"-{i}", r["request_id"][:8], r["name"] or "-", Path(str(r["model"])).name,
                 age(r["created_at"]), " ".join(f"{k}={v}" for k, v in sorted(r["counts"].items())))
    return table


def elapsed(started: datetime | None, finished: datetime | None) -> str:
    """A job's time running: ``1:05`` (minutes:seconds) until it finished, or so far; ``-`` before it started."""
    if started is None:
        return "-"
    secs = max(0.0, ((finished or utcnow()) - started).total_seconds())
    return f"{int(secs // 60)}:{int(secs % 60):02d}"


def client_label(row: ResultRow) -> str:
    """The client that sent a row's load, short (``CLIENT_LABELS``); ``-`` for an edge row or one not measured."""
    client = row.get("client")
    return "-" if row.get("edge_profile") or client in (None, "auto") else CLIENT_LABELS.get(client, client)


def metric_cell(row: ResultRow, name: str) -> str:
    """A metric's table cell; for a row merged over repeats with a ``spread`` ``[min, max]``, the median and half
    the range in % of it: ``840 ±3%`` for runs from 814 to 870."""
    spread = (row.get("spread") or {}).get(name) if name in RANGE_METRICS else None
    text = fmt_value(name, row.get(name))
    if not spread or not row.get(name):
        return text
    half = 50.0 * (spread[1] - spread[0]) / abs(row[name])
    return f"{text} ±{half:.1f}%" if half < 1 else f"{text} ±{half:.0f}%"


def repeat_lines(rows: list[ResultRow]) -> list[str]:
    """How to read rows merged over repeats (one line, or none), and the client abbreviation in use."""
    lines = []
    if any((r.get("repeats") or 0) > 1 for r in rows):
        lines.append("n: the succeeded runs of each cell (--repeats); infer/s and p50 show their median ± half "
                     "their min-max range (in % of the median), the other metrics their median or declared "
                     "aggregation; every run: --format json")
    if any(client_label(r) == "pa" for r in rows):
        lines.append("client pa: perf_analyzer")
    return lines + client_note_lines(rows)


def client_note_lines(rows: list[ResultRow]) -> list[str]:
    """Why rows were measured by another client than the first ``--client auto`` tries (perf_analyzer absent,
    its install failed, an RPC it cannot send): one line per reason, naming the rows."""
    by_note: dict[str, list[str]] = {}
    for r in rows:
        if r.get("client_note"):
            by_note.setdefault(r["client_note"], []).append(r["job_id"][:6])
    return [f"{', '.join(ids)}: {note}" for note, ids in by_note.items()]


def load_label(row: Mapping[str, Any]) -> str:
    """The batch size, concurrency and open-loop rate of a result row: ``8x4`` or ``1x1@100/s``."""
    return f"{row['batch_size']}x{row['concurrency']}{rate_text(row)}"


def serving_label(row: Mapping[str, Any]) -> str:
    """The serving configuration of a result row (``SERVING_KEYS``), short: ``i=2 t=1 q=500us p=8``; ``-``
    for the plain one (1 instance, engine default threads, no dynamic batching)."""
    parts = [f"i={row['instances']}" if row.get("instances") not in (None, 1) else "",
             f"t={row['threads']}" if row.get("threads") else "",
             f"q={row['max_queue_delay_us']}us" if row.get("max_queue_delay_us") is not None else "",
             f"p={row['preferred_batch_size']}" if row.get("preferred_batch_size") else ""]
    return " ".join(p for p in parts if p) or "-"


def config_label(config: Mapping[str, Any]) -> str:
    """A serving configuration with its device, engine and batch size: ``cpu onnxruntime b=1 i=2``."""
    label = serving_label(config)
    knobs = "".join(f" {k}={v}" for k, v in sorted((config.get("knobs") or {}).items()))
    return (f"{config['device']} {config['engine']} b={config['batch_size']}" + ("" if label == "-" else f" {label}")
            + knobs)


def job_label(row: ResultRow) -> str:
    """The short job id, marked when the job shared its host without isolation (see ``shared_lines``)."""
    job_id: str = row["job_id"]
    return (job_id[:6] + (SHARED_MARK if shared_unisolated(row) else "")
            + (CLIENT_LIMITED_MARK if client_limited(row) else ""))


def client_limited_lines(rows: list[ResultRow]) -> list[str]:
    """The footnote for client-limited jobs (marked by ``job_label``): one line naming them (or none)."""
    by_client: dict[str | None, list[str]] = {}
    for r in rows:
        if client_limited(r):
            by_client.setdefault(r.get("client"), []).append(r["job_id"][:6])
    return [f"{CLIENT_LIMITED_MARK} {', '.join(ids)}: {client_limited_note(client)}"
            for client, ids in by_client.items()]


def shared_lines(rows: list[ResultRow]) -> list[str]:
    """The footnote for the jobs marked by ``job_label``: one line naming them (empty when none)."""
    marked = [r["job_id"][:6] for r in rows if shared_unisolated(r)]
    return [f"{SHARED_MARK} {', '.join(marked)}: {SHARED_NOTE}"] if marked else []


def measured_lines(rows: list[ResultRow]) -> list[str]:
    """How the rows were measured (``measured``: serving end to end over gRPC, edge in-process), one line per
    kind present, and a warning against comparing the two kinds when both are."""
    kinds = list(dict.fromkeys(("edge" if r.get("edge_profile") else "serving", r.get("measured")) for r in rows
                               if r.get("measured")))
    lines = [f"{kind} rows: {how}" for kind, how in kinds]
    if {k for k, _ in kinds} == {"serving", "edge"} and any(how == MEASURED_EDGE for _, how in kinds):
        lines.append("edge rows pay no per-request transport cost: do not compare their throughput or latency "
                     "with serving rows")
    return lines


def turn_lines(rows: list[ResultRow]) -> list[str]:
    """A sessions row's figures per turn (``turn{k}_*`` metrics), one line each: ``abc123 per turn: TTFT p50 ms
    12.1 | 14.0 | 15.2; prompt tokens from cache % - | 85.0 | 91.0`` (the job's details hold every turn's)."""
    lines = []
    for r in rows:
        turns = [k for k in range(1, TURN_METRICS + 1) if r.get(f"turn{k}_ttft_p50_ms") is not None]
        if not turns:
            continue
        ttft = " | ".join(fmt_value("ttft_p50_ms", r.get(f"turn{k}_ttft_p50_ms")) for k in turns)
        cached = " | ".join(fmt_value("cached_prompt_tokens_pct", r.get(f"turn{k}_cached_prompt_tokens_pct"))
                            for k in turns)
        lines.append(f"{job_label(r)} per turn 1-{turns[-1]}: TTFT p50 ms {ttft}; prompt tokens from cache % {cached}")
    return lines


def error_lines(rows: list[ResultRow]) -> list[str]:
    """One line per job that has an error: short job id and the error."""
    return [f"{r['job_id'][:6]}: {' '.join(str(r['error']).split())}" for r in rows if r.get("error")]


def steal_lines(rows: list[ResultRow]) -> list[str]:
    """One line per job measured while the hypervisor stole a noticeable share of the CPUs."""
    return [f"{r['job_id'][:6]}: {note}" for r in rows if (note := steal_note(r.get("cpu_steal_pct")))]


def host_lines(rows: list[ResultRow]) -> list[str]:
    """One line per note of a job whose host drifted or was busy on its cores while it was measured (the bounds
    ``FARM_HOST_DRIFT_PCT``, ``FARM_HOST_BUSY_PCT``)."""
    s = get_settings()
    return [f"{r['job_id'][:6]}: {note}" for r in rows for note in host_notes(r, s.host_drift_pct, s.host_busy_pct)]


def slot_text(slot: SlotJson | None) -> str:
    """A worker row's slot for humans: ``<index> GPU <nvml index> <uuid>`` (``-`` for a worker without slots)."""
    if not slot:
        return "-"
    if slot.get("gpu_uuid") is None:
        return f"{slot.get('index', 0)} cpu"
    return f"{slot.get('index', 0)} GPU {slot.get('gpu_index')} {slot.get('gpu_uuid')}"


def workers_table(rows: list[WorkerRow]) -> Table:
    """The workers as a Rich table, one line per slot: what it has, consumes and is doing (job or idle)."""
    table = Table(title="workers")
    for col in ("worker", "host", "slot", "runner", "status", "heartbeat", "cpu", "gpus", "queues", "job"):
        table.add_column(col)
    for w in rows:
        cpu = w["cpu"]
        job = (w["current_job_id"] or "")[:8] or ("idle" if w["status"] == WorkerStatus.online else "-")
        safe_row(table, w["worker_id"], w["hostname"], slot_text(w.get("slot")), w["runner"], w["status"],
                      age(w["last_heartbeat"]), f"{cpu.get('logical_cores', '?')}x {cpu.get('model', '')}"[:40],
                      ", ".join(w["gpus"]) or "-", ", ".join(w["queues"]), job)
    return table


def age(ts: datetime | None) -> str:
    if ts is None:
        return "-"
    secs = (utcnow() - ts).total_seconds()
    return f"{secs:.0f}s ago" if secs < 120 else f"{secs / 60:.0f}m ago"



"""Rendering results, status and workers with Rich (table), CSV or JSON."""
from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from farm.db.models import utcnow

# farm.formatting: shared with the reports; to_csv and to_json are re-exported for the CLI's commands
from farm.formatting import fmt_value, rate_text, safe_text
from farm.formatting import to_csv as to_csv
from farm.formatting import to_json as to_json
from farm.settings import get_settings
from farm.steal import steal_note
from schemas.result import SHARED_NOTE, client_limited, client_limited_note, host_notes, shared_unisolated
from schemas.worker import WorkerStatus

SHARED_MARK = "!"  # after a job id: measured beside another farm job without core isolation
CLIENT_LIMITED_MARK = "~"  # after a job id: open-loop run whose own late sends exceeded the limit

#: the CLI's consoles; piped output is not squeezed to 80 columns (a terminal keeps its own width)
console = Console() if sys.stdout.isatty() else Console(width=140)
err_console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=140)

#: the default results table: (metric, short header); every metric is in csv/json
TABLE_METRICS: tuple[tuple[str, str], ...] = (
    ("throughput_infer_per_s", "infer/s"), ("latency_p50_ms", "p50 ms"), ("latency_p99_ms", "p99 ms"),
    ("server_compute_p50_ms", "srv p50"), ("stable", "stable"), ("cpu_pct_avg", "cpu %"),
    ("mem_peak_bytes", "mem MiB"),
)
#: metrics whose range over a cell's runs the table shows beside the median (``farm.results.merge_repeats``)
RANGE_METRICS = ("throughput_infer_per_s", "latency_p50_ms")
#: the load client, short, in the results table (``-``: an edge row, or not measured yet)
CLIENT_LABELS = {"farm": "farm", "perf_analyzer": "pa"}


def say(text: str, style: str | None = None, to: Console | None = None, soft_wrap: bool = False) -> None:
    """Print a line that holds user strings (names, paths, stored errors) literally (``safe_text``: no markup,
    control characters escaped), in ``style`` when given, on ``to`` (default: stdout's console)."""
    (to or console).print(safe_text(text, style or ""), highlight=False, soft_wrap=soft_wrap)


def safe_row(table: Table, *cells: object) -> None:
    """Add a table row whose text cells may hold user strings: each shown literally (``safe_text``); Rich
    renderables (a styled ``Text``) are added as they are."""
    table.add_row(*(c if isinstance(c, Text) else safe_text(c) for c in cells))


def results_table(rows: list[dict[str, Any]], title: str = "") -> Table:
    """The results as a Rich table; errors are listed under it (see ``error_lines``). ``title`` and the
    cells are shown literally. Rows merged over repeats (``farm.results.merge_repeats``) get an ``n`` column
    (their runs) and their spread beside the median (``metric_cell``)."""
    table = Table(title=safe_text(title) if title else None, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    serving = any(serving_label(r) != "-" for r in rows)  # the column only when a serving dimension varies
    runs = any((r.get("repeats") or 0) > 1 for r in rows)
    for col in ("job", "device", "engine", *(("serving",) if serving else ()), "b x c", "edge", "client", "status",
                *(("n",) if runs else ())):
        table.add_column(col, no_wrap=True)
    for _, head in TABLE_METRICS:
        table.add_column(head, justify="right")
    for r in rows:
        safe_row(table, job_label(r), r["device"], r["engine"], *((serving_label(r),) if serving else ()),
                 load_label(r), r["edge_profile"] or "-", client_label(r), r["status"],
                 *((str(r.get("repeats", 1)),) if runs else ()),
                 *(metric_cell(r, n) for n, _ in TABLE_METRICS))
    return table


def client_label(row: dict[str, Any]) -> str:
    """The client that sent a row's load, short (``CLIENT_LABELS``); ``-`` for an edge row or one not measured."""
    client = row.get("client")
    return "-" if row.get("edge_profile") or client in (None, "auto") else CLIENT_LABELS.get(client, client)


def metric_cell(row: dict[str, Any], name: str) -> str:
    """A metric's table cell; for a row merged over repeats with a ``spread`` ``[min, max]``, the median and half
    the range in % of it: ``840 ±3%`` for runs from 814 to 870."""
    spread = (row.get("spread") or {}).get(name) if name in RANGE_METRICS else None
    text = fmt_value(name, row.get(name))
    if not spread or not row.get(name):
        return text
    half = 50.0 * (spread[1] - spread[0]) / abs(row[name])
    return f"{text} ±{half:.1f}%" if half < 1 else f"{text} ±{half:.0f}%"


def repeat_lines(rows: list[dict[str, Any]]) -> list[str]:
    """How to read rows merged over repeats (one line, or none), and the client abbreviation in use."""
    lines = []
    if any((r.get("repeats") or 0) > 1 for r in rows):
        lines.append("n: the succeeded runs of each cell (--repeats); infer/s and p50 show their median ± half "
                     "their min-max range (in % of the median), the other metrics their median or declared "
                     "aggregation; every run: --format json")
    if any(client_label(r) == "pa" for r in rows):
        lines.append("client pa: perf_analyzer")
    return lines + client_note_lines(rows)


def client_note_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Why rows were measured by another client than the first ``--client auto`` tries (perf_analyzer absent,
    its install failed, an RPC it cannot send): one line per reason, naming the rows."""
    by_note: dict[str, list[str]] = {}
    for r in rows:
        if r.get("client_note"):
            by_note.setdefault(r["client_note"], []).append(r["job_id"][:6])
    return [f"{', '.join(ids)}: {note}" for note, ids in by_note.items()]


def load_label(row: dict[str, Any]) -> str:
    """The batch size, concurrency and open-loop rate of a result row: ``8x4`` or ``1x1@100/s``."""
    return f"{row['batch_size']}x{row['concurrency']}{rate_text(row)}"


def serving_label(row: dict[str, Any]) -> str:
    """The serving configuration of a result row (``SERVING_KEYS``), short: ``i=2 t=1 q=500us p=8``; ``-``
    for the plain one (1 instance, engine default threads, no dynamic batching)."""
    parts = [f"i={row['instances']}" if row.get("instances") not in (None, 1) else "",
             f"t={row['threads']}" if row.get("threads") else "",
             f"q={row['max_queue_delay_us']}us" if row.get("max_queue_delay_us") is not None else "",
             f"p={row['preferred_batch_size']}" if row.get("preferred_batch_size") else ""]
    return " ".join(p for p in parts if p) or "-"


def config_label(config: dict[str, Any]) -> str:
    """A serving configuration with its device, engine and batch size: ``cpu onnxruntime b=1 i=2``."""
    label = serving_label(config)
    return f"{config['device']} {config['engine']} b={config['batch_size']}" + ("" if label == "-" else f" {label}")


def job_label(row: dict[str, Any]) -> str:
    """The short job id, marked when the job shared its host without isolation (see ``shared_lines``)."""
    job_id: str = row["job_id"]
    return (job_id[:6] + (SHARED_MARK if shared_unisolated(row) else "")
            + (CLIENT_LIMITED_MARK if client_limited(row) else ""))


def client_limited_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The footnote for client-limited jobs (marked by ``job_label``): one line naming them (or none)."""
    by_client: dict[str | None, list[str]] = {}
    for r in rows:
        if client_limited(r):
            by_client.setdefault(r.get("client"), []).append(r["job_id"][:6])
    return [f"{CLIENT_LIMITED_MARK} {', '.join(ids)}: {client_limited_note(client)}"
            for client, ids in by_client.items()]


def shared_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The footnote for the jobs marked by ``job_label``: one line naming them (empty when none)."""
    marked = [r["job_id"][:6] for r in rows if shared_unisolated(r)]
    return [f"{SHARED_MARK} {', '.join(marked)}: {SHARED_NOTE}"] if marked else []


def measured_lines(rows: list[dict[str, Any]]) -> list[str]:
    """How the rows were measured (``measured``: serving end to end over gRPC, edge in-process), one line per
    kind present, and a warning against comparing the two kinds when both are."""
    kinds = list(dict.fromkeys(("edge" if r.get("edge_profile") else "serving", r.get("measured")) for r in rows
                               if r.get("measured")))
    lines = [f"{kind} rows: {how}" for kind, how in kinds]
    if {k for k, _ in kinds} == {"serving", "edge"}:
        lines.append("edge rows pay no per-request transport cost: do not compare their throughput or latency "
                     "with serving rows")
    return lines


def error_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per job that has an error: short job id and the error."""
    return [f"{r['job_id'][:6]}: {' '.join(str(r['error']).split())}" for r in rows if r.get("error")]


def steal_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per job measured while the hypervisor stole a noticeable share of the CPUs."""
    return [f"{r['job_id'][:6]}: {note}" for r in rows if (note := steal_note(r.get("cpu_steal_pct")))]


def host_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per note of a job whose host drifted or was busy on its cores while it was measured (the bounds
    ``FARM_HOST_DRIFT_PCT``, ``FARM_HOST_BUSY_PCT``)."""
    s = get_settings()
    return [f"{r['job_id'][:6]}: {note}" for r in rows for note in host_notes(r, s.host_drift_pct, s.host_busy_pct)]


def slot_text(slot: dict[str, Any] | None) -> str:
    """A worker row's slot for humans: ``<index> GPU <nvml index> <uuid>`` (``-`` for a worker without slots)."""
    if not slot:
        return "-"
    if slot.get("gpu_uuid") is None:
        return f"{slot.get('index', 0)} cpu"
    return f"{slot.get('index', 0)} GPU {slot.get('gpu_index')} {slot.get('gpu_uuid')}"


def workers_table(rows: list[dict[str, Any]]) -> Table:
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



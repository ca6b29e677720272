"""One reading of every client's run: a :class:`~workers.loadgen.contract.LoadRecord` turned into the job's
metrics (``schemas.metrics`` names), notes and details; and the stability rule every client's windows are
judged by."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas import MeasurementSettings
from schemas.input_data import InputData
from schemas.metrics import MetricValues
from schemas.result import client_limited, client_limited_note
from workers.loadgen import stats
from workers.loadgen.contract import LoadJob, LoadRecord, LoadResult, WindowFigures


def judge_stable(windows: Sequence[WindowFigures], settings: MeasurementSettings) -> bool:
    """The job's stability rule on a run's windows: the last ``min_windows`` agree within ``stability_pct``
    (``stats.is_stable``) on throughput and the ``stability_latency``."""
    return stats.is_stable([w.public() for w in windows], settings.min_windows, settings.stability_pct,
                           stats.stability_keys(settings.stability_latency))


def _metrics(job: LoadJob, record: LoadRecord) -> MetricValues:
    """The run's metrics. A client-limited run reports no latency (its end-to-end latencies stay in the
    details, ``client_limited_latency``)."""
    t = record.totals
    queue, compute = t.queue_ms, t.compute_ms
    late = job.pattern.late_pct(t.sent, t.late)
    latency = stats.latency_metrics(t.lat_ms, job.batch_size, t.duration_s)
    if client_limited({"late_send_pct": late}):
        latency = {k: (None if k.startswith("latency_") else v) for k, v in latency.items()}
    return {
        **latency,
        "server_queue_p50_ms": stats.percentile(queue, 50) if queue.size else None,
        "server_compute_p50_ms": stats.percentile(compute, 50) if compute.size else None,
        "server_compute_p99_ms": stats.percentile(compute, 99) if compute.size else None,
        "error_count": int(sum(t.errors.values())),
        "late_send_pct": late,
        "client_busy_pct": max(t.busy_by_process),
        "stable": bool(t.stable),
        "windows": len(record.windows),
        "duration_s": t.duration_s,
        **record.metrics,
    }


def _notes(job: LoadJob, record: LoadRecord) -> list[str]:
    """The warnings any client's run gets after its own: client-limited (open loop, over 1 % late sends),
    the client's own cost (closed loop; per client process) and an unstable measurement."""
    t, settings = record.totals, job.settings
    notes = list(record.notes)
    late = job.pattern.late_pct(t.sent, t.late)
    if client_limited({"late_send_pct": late}):
        notes.append(f"{late:.1f} % late sends; {client_limited_note(record.client)} "
                     "(its latency: details.client_limited_latency)")
    share = stats.client_share_note(max(t.busy_by_process), job.pattern.outstanding(record.processes), record.label)
    if share:
        notes.append(share)
    if not t.stable:
        notes.append(f"not stable: the last {settings.min_windows} windows did not agree within "
                     f"±{settings.stability_pct:g} % on throughput and {settings.stability_latency} latency")
    return notes


def _details(job: LoadJob, record: LoadRecord, notes: list[str]) -> dict[str, Any]:
    """Histogram, per-window figures, errors, warm-up count, the client and the plan the run used, then the
    client's own entries."""
    t, settings = record.totals, job.settings
    limited = client_limited({"late_send_pct": job.pattern.late_pct(t.sent, t.late)})
    used = record.windows[record.metric_windows]
    return {
        "client": record.client, "client_limited": limited, "mode": job.pattern.mode, "rpc": record.rpc,
        "rate": job.pattern.rate,
        "client_limited_latency": stats.latency_metrics(t.lat_ms, job.batch_size, t.duration_s) if limited else None,
        "concurrency": job.load.concurrency, "batch_size": job.batch_size, "processes": record.processes,
        "warmup_s": settings.warmup_s, "window_s": settings.window_s,
        "metrics_windows": [used[0].k, used[-1].k],
        "stopped_when_stable": record.stopped_when_stable,
        "latency_histogram": stats.histogram(t.lat_ms),
        "windows": [w.public() for w in record.windows],
        "errors": t.errors,
        "warmup_requests": record.warmup_requests,
        "sent": t.sent, "late_sends": t.late,
        "client_busy_pct_by_process": t.busy_by_process,
        "client_process": record.client_process,
        "input_data": (job.data or InputData()).describe(),
        **record.own.details(),
        "notes": notes,
    }


def to_result(job: LoadJob, record: LoadRecord, notes_before: Sequence[str] = ()) -> LoadResult:
    """The job's result from any client's record (``notes_before``: the choice of client's own, first)."""
    return LoadResult(metrics=_metrics(job, record),
                      details=_details(job, record, [*notes_before, *_notes(job, record)]))

"""Results queries shared by the CLI, reports and tests: one row per job, metrics from the registry."""
from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypedDict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from farm.db.models import Job, ModelArtifact, Request, Result, Worker, live_worker
from farm.db.session import session_scope
from farm.errors import ArtifactError, NotFoundError, RequestError
from farm.formatting import knobs_text
from farm.payloads import RequestSummary, WorkerRow
from farm.readers.rows import MIXED, ResultRow, as_row, as_rows
from farm.settings import get_settings
from farm.store.backends import open_store
from schemas import COORDINATE_KEYS, MEASUREMENT_KEYS, SERVING_KEYS
from schemas.hardware import HardwareJson
from schemas.job import JobStatus, protocol_of
from schemas.llm import Slo, cache_state_of
from schemas.llm_facts import LLM_FACT_COLUMNS
from schemas.load import LoadDetails
from schemas.measured import LLM_RPC, how_measured
from schemas.metrics import BY_NAME, JOB_METRICS
from schemas.metrics import merge_repeats as merge_metrics
from schemas.request import MEASUREMENT_DEFAULTS
from schemas.result import PLACEMENT_COLUMNS, shared_unisolated

#: ``repeat``: which run of its cell a job is (0-based; ``JobSpec.repeat``, kept in ``jobs.spec``; not a coordinate)
JOB_COLUMNS = ("job_id", "device", "engine", "batch_size", "concurrency", "edge_profile", "status",
               "attempts", "worker_id", "error", "repeat")
METRIC_NAMES = tuple(m.name for m in JOB_METRICS)
#: a job's coordinates (``schemas.COORDINATE_KEYS``; the serving-configuration keys come from its measurement)
COORDINATE_COLUMNS = COORDINATE_KEYS
#: a row's coordinates after the job's own (``schemas.MEASUREMENT_KEYS``): the serving dimensions its spec's
#: measurement holds (``jobs.spec -> measurement``) and the open-loop rate (the ``jobs.rate`` column)
MEASUREMENT_COLUMNS = MEASUREMENT_KEYS
#: what makes two jobs (of the same or of different requests) repeats of one measurement; ``knob_set``: the LLM
#: engine knobs the job asked for (``JobSpec.knobs`` as ``farm.formatting.knobs_text``; None: none), so the
#: cells of a knob sweep stay apart (the ``knobs`` column holds what the server ran with, n_threads included);
#: ``prefix_cache``: an LLM job's prefix-cache state (cold and warm are two jobs of one cell, never repeats)
CONFIG_COLUMNS = (*COORDINATE_COLUMNS, "knob_set", "prefix_cache", "rpc", "client")


def llm_rows(rows: list[ResultRow]) -> bool:
    """Whether ``rows`` hold LLM results (their jobs spoke the OpenAI API, ``ResultRow.protocol``): tables,
    headlines and compare use their metrics."""
    return any(as_row(r).protocol == "openai" for r in rows)


def measured(row: ResultRow) -> str:
    """How ``row`` was measured, in words (``schemas.measured``, the one wording)."""
    return how_measured(bool(row.get("edge_profile")), row.get("rpc"))


#: request ids by recency: ``latest`` (or ``-1``) is the newest request, ``-2`` the one before, ...
RECENT_RE = re.compile(r"^(?:latest|-([1-9][0-9]{0,5}))$")


def find_request(request_id: str) -> Request:
    """The request with id ``request_id``: a full id, a unique prefix of at least 4 characters, ``latest``
    (the newest request) or ``-N`` (the Nth newest: ``-1`` is ``latest``). Every command that takes a request
    id resolves it here."""
    recent = RECENT_RE.match(request_id.strip())
    with session_scope() as s:
        if recent:
            nth = int(recent.group(1) or 1)
            req = s.execute(select(Request).order_by(Request.created_at.desc(), Request.id)
                            .offset(nth - 1).limit(1)).scalar_one_or_none()
            if req is None:
                raise NotFoundError(f"no request {request_id!r}: there are fewer than {nth} request(s); "
                                    "`farm status` lists them")
            return req
        if request_id.startswith("-"):  # an option the command does not know, passed through as an id
            raise RequestError(f"no such option: {request_id} (a request id is an id, a prefix, latest or -N)")
        req = s.get(Request, request_id)
        if req is None and len(request_id) >= 4:
            matches = s.execute(select(Request).where(Request.id.startswith(request_id, autoescape=True))
                                .limit(2)).scalars().all()
            req = matches[0] if len(matches) == 1 else None
        if req is None:
            raise NotFoundError(f"no request {request_id!r}; `farm status` lists requests")
        return req


class SloGoals(TypedDict, total=False):
    """Latency goals as a request stores them (``schemas.llm.Slo`` fields, ms; an absent or None one: no goal)."""

    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None


_SLO_KEYS: tuple[Literal["ttft_ms", "tpot_ms", "e2e_ms"], ...] = ("ttft_ms", "tpot_ms", "e2e_ms")


def request_slo(req: Request) -> SloGoals | None:
    """The latency goals (``schemas.llm.Slo`` fields, ms) an LLM request was submitted with; None without."""
    llm = (req.spec.get("measurement") or {}).get("llm") or {}
    slo = llm.get("slo")
    if not isinstance(slo, dict) or not slo:
        return None
    goals = SloGoals()
    for key in _SLO_KEYS:
        if key in slo:
            goals[key] = slo[key]
    return goals


def request_goals(req: Request) -> Slo | None:
    """:func:`request_slo` as the model (``schemas.llm.Slo``); None without."""
    return slo_of(request_slo(req))


def slo_of(slo: SloGoals | None) -> Slo | None:
    """Stored (or sent) latency goals as ``schemas.llm.Slo``; None for none."""
    return Slo.model_validate(slo) if slo else None


def job_times(request_id: str) -> dict[str, tuple[datetime | None, datetime | None]]:
    """Each job of the request: when it started running and when it finished (None: not yet)."""
    with session_scope() as s:
        rows = s.execute(select(Job.id, Job.started_at, Job.finished_at).where(Job.request_id == request_id)).all()
    return {job_id: (started, finished) for job_id, started, finished in rows}


def result_rows(request_id: str) -> list[ResultRow]:
    """Every job of the request with its serving dimensions and rate (:data:`MEASUREMENT_COLUMNS`), how and where it
    was measured (``measured``; ``schemas.Placement`` fields) and its result metrics (None where not measured),
    in matrix order; ``rpc``, ``client`` and ``input_data`` (``random``, ``zeros`` or ``file:NAME``) say how
    the request drove its jobs (``client``: the one that measured the row, ``farm`` or ``perf_analyzer``, where
    the request left the choice to the worker, ``auto``); ``server`` (``NAME VERSION``) names the server
    program a job's engine ran (llama.cpp: ``llama-server`` or ``llama-cpp-python``), or the running server an
    endpoint request profiled; an LLM job's facts (``schemas.llm_facts.LLM_FACT_COLUMNS``: knobs,
    n_threads, tokenizer, workload) are None for other jobs; ``model_sha256`` is the request's model file."""
    req = find_request(request_id)
    metric_cols = [getattr(Result, n) for n in PLACEMENT_COLUMNS + LLM_FACT_COLUMNS + METRIC_NAMES]
    stmt = (select(Job.id, Job.device, Job.engine, Job.batch_size, Job.concurrency, Job.edge_profile,
                   Job.status, Job.attempts, Job.worker_id, Job.error, Job.spec["repeat"], *metric_cols,
                   Job.spec["measurement"], Job.rate, Job.spec["knobs"], Job.spec["protocol"].as_string(),
                   Result.details[("load", "client")].as_string(),
                   Result.details[("load", "notes", 0)].as_string())
            .outerjoin(Result, Result.job_id == Job.id)
            .where(Job.request_id == req.id)
            .order_by(Job.edge_profile.is_not(None), Job.edge_profile, Job.device, Job.engine, Job.batch_size,
                      Job.concurrency))
    with session_scope() as s:
        rows = s.execute(stmt).all()
    server = _endpoint_server(req)
    names = JOB_COLUMNS + PLACEMENT_COLUMNS + LLM_FACT_COLUMNS + METRIC_NAMES
    measurement = req.spec.get("measurement") or {}  # how every job of it was driven, and by which client
    rpc, client = measurement.get("rpc", "unary"), measurement.get("client", "farm")  # before "auto": farm
    rpc = LLM_RPC if measurement.get("llm") else rpc
    data = req.spec.get("input_data") or {"kind": "random"}  # which values every job of it sent
    input_data = f"file:{data.get('source')}" if data.get("kind") == "file" else data.get("kind", "random")
    extra: dict[str, Any] = {"rpc": rpc, "client": client, "input_data": input_data, "model_sha256": req.model_sha256,
                             **({"server": server} if server else {})}
    out = []
    for *values, job_measurement, rate, asked, protocol, measured_by, first_note in rows:
        row = dict(zip(names, values, strict=True))
        r = ResultRow({**{k: row.pop(k) for k in JOB_COLUMNS[:5]}, **measurement_values(job_measurement, rate), **row,
                       **extra})
        r["knob_set"] = knobs_text(asked) if isinstance(asked, dict) and asked else None
        r["prefix_cache"] = cache_state_of(job_measurement)  # from the spec: a failed job has no result row
        # the job's protocol (``JobSpec.protocol``; a job stored before it: from its card, as the spec loads)
        r["protocol"] = protocol or protocol_of(r.engine, (job_measurement or {}).get("llm"))
        r["client"] = measured_by or client
        # under auto, why the client before it could not measure (the load notes' first, ``clients.measure``)
        r["client_note"] = first_note if first_note and first_note.startswith("measured by ") else None
        r["repeat"] = int(r["repeat"] or 0)  # a job of a request without repeats (or from before them): run 0
        r["measured"] = measured(r)
        out.append(r)
    if any(measurement_values(None) != {k: r[k] for k in MEASUREMENT_COLUMNS} or r["repeat"] for r in out):
        out.sort(key=_matrix_order)  # several serving configurations, rates or runs: each one's steps together
    return out


def measurement_values(measurement: dict[str, Any] | None, rate: float | None = None) -> dict[str, Any]:
    """A job's :data:`MEASUREMENT_COLUMNS`: the serving dimensions its spec's ``measurement`` holds (JSON; the
    ``MeasurementSettings`` defaults where a key is absent: jobs submitted before the key existed), and its
    open-loop ``rate`` (requests/s, the ``jobs.rate`` column; None in closed loop)."""
    m = measurement if isinstance(measurement, dict) else {}
    return {**{k: m.get(k, MEASUREMENT_DEFAULTS[k]) for k in SERVING_KEYS}, "rate": rate}


def _matrix_order(row: ResultRow) -> tuple[Any, ...]:
    key: list[Any] = [row["edge_profile"] is not None]
    for c in COORDINATE_COLUMNS:
        v = row[c]
        key += [v is not None, v if v is not None else 0]
    return (*key, row.get("repeat") or 0)


def result_details(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The stored ``details`` (latency histograms, per-window figures, notes) of the given jobs' results."""
    if not job_ids:
        return {}
    with session_scope() as s:
        rows = s.execute(select(Result.job_id, Result.details).where(Result.job_id.in_(job_ids))).all()
    return {jid: details or {} for jid, details in rows}


def load_details(details: dict[str, Any]) -> LoadDetails:
    """The load generator's part of a result's ``details``, typed (``latency_histogram``, ``windows``,
    ``metrics_windows``, ...; see ``workers.loadgen.result``); empty for a job that stored none (edge runs)."""
    return LoadDetails.of(details)


#: the most of an endpoint's descriptor (``farm.endpoint``: a small JSON file) a reader takes, bytes
_DESCRIPTOR_BYTES = 1 << 20


def _endpoint_server(req: Request) -> str | None:
    """``NAME VERSION`` of the running server an endpoint request profiled (its ServerMetadata at
    submission, kept in the request's descriptor artifact, read from the model store); None for a model file, or
    where the store cannot be read."""
    if not req.spec.get("endpoint"):
        return None
    try:  # a small JSON file, read whole
        with open_store().get(req.model_sha256) as blob:
            server = json.loads(blob.read(_DESCRIPTOR_BYTES) or b"{}").get("server") or {}
    except (ValueError, ArtifactError):
        return None
    return f"{server.get('name', '?')} {server.get('version', '?')}"


def model_static_metrics(model_sha256: str) -> dict[str, Any]:
    """The static metrics (params, MACs, FLOPs per sample, ...) stored once with the model artifact
    ``model_sha256``; empty when none were computed."""
    with session_scope() as s:
        static = s.execute(select(ModelArtifact.static_metrics)
                           .where(ModelArtifact.sha256 == model_sha256)).scalar_one_or_none()
    return static or {}


def merge_repeats(rows: list[ResultRow], center: str = "declared") -> list[ResultRow]:
    """One row per job config (:data:`CONFIG_COLUMNS`) from result rows of repeated runs (the ``--repeats`` runs
    of a request, or several requests of the same matrix), in first-seen order. Metrics of the succeeded repeats
    combine by each metric's declared aggregation (``schemas.metrics``); with ``center="median"`` the metrics
    declared ``mean`` take the median instead (what ``farm results`` shows for a request's repeats: one slow run
    does not drag it). ``repeats`` counts the succeeded runs; ``spread`` holds ``[min, max]`` over them of each
    metric declared ``mean`` (two runs or more). ``status`` is the shared status or ``mixed``; ``job_id`` is the
    first repeat's; ``error`` the first error; a repeat measured beside another farm job without isolation marks
    the merged row the same way."""
    groups: dict[tuple[Any, ...], list[ResultRow]] = {}
    for r in as_rows(rows):
        groups.setdefault(tuple(r.get(c) for c in CONFIG_COLUMNS), []).append(r)
    merged = []
    for group in groups.values():
        done = [r for r in group if r.succeeded]
        metrics = merge_metrics([{n: r[n] for n in METRIC_NAMES if r[n] is not None} for r in done])
        statuses = {r.status for r in group}
        merged.append(ResultRow({**group[0], **{n: metrics.get(n) for n in METRIC_NAMES},
                                 **_repeat_spread(done, center),
                       "repeats": len(done), "status": statuses.pop() if len(statuses) == 1 else MIXED,
                       "attempts": sum(r["attempts"] or 0 for r in group),
                       "error": next((r["error"] for r in group if r["error"]), None),
                       **({"host_shared": True, "isolated": False} if any(shared_unisolated(r) for r in done)
                          else {})}))
    return merged


def _repeat_spread(done: list[ResultRow], center: str) -> dict[str, Any]:
    """Of the succeeded runs ``done`` of one cell, for each metric declared ``mean``: its median (``center``
    ``median``) and ``spread``, ``{metric: [min, max]}`` (two runs or more)."""
    out: dict[str, Any] = {}
    spread: dict[str, list[float]] = {}
    for n in METRIC_NAMES:
        values = [float(r[n]) for r in done if BY_NAME[n].aggregation == "mean" and r[n] is not None]
        if values and center == "median":
            out[n] = statistics.median(values)
        if len(values) >= 2:
            spread[n] = [min(values), max(values)]
    return {**out, "spread": spread}


def status_counts(request_id: str) -> dict[str, int]:
    """Job counts by status for one request."""
    req = find_request(request_id)
    with session_scope() as s:
        rows = s.execute(select(Job.status, func.count()).where(Job.request_id == req.id).group_by(Job.status))
        return {status: n for status, n in rows}


def recent_requests(limit: int = 20) -> list[RequestSummary]:
    """The newest requests with their job counts by status."""
    with session_scope() as s:
        reqs = s.execute(select(Request.id, Request.name, Request.created_at, Request.spec)
                         .order_by(Request.created_at.desc()).limit(limit)).all()
        counts = status_counts_of(s, [r.id for r in reqs])
    return [RequestSummary(request_id=r.id, name=r.name, created_at=r.created_at, model=request_model(r.spec),
                           counts=dict(counts[r.id])) for r in reqs]


def status_counts_of(s: Session, ids: list[str]) -> dict[str, Counter[str]]:
    """Each of requests ``ids``' job counts by status, in one query (an id without jobs: empty)."""
    counts: dict[str, Counter[str]] = {i: Counter() for i in ids}
    if ids:
        for rid, status, n in s.execute(select(Job.request_id, Job.status, func.count())
                                        .where(Job.request_id.in_(ids)).group_by(Job.request_id, Job.status)):
            counts[rid][status] = n
    return counts


def request_model(spec: Mapping[str, object]) -> str:
    """A stored request's model for lists: its file, or ``NAME@ENDPOINT`` (an endpoint request)."""
    return str(spec.get("model") or f"{spec.get('model_name')}@{spec.get('endpoint')}")


def workers_table() -> list[WorkerRow]:
    """All registered workers, newest heartbeat first; a GPU host's worker has one row per slot (``slot``: its
    index, GPU UUID and product; None for a worker of one slot without GPUs)."""
    with session_scope() as s:
        rows = s.execute(select(Worker).order_by(Worker.last_heartbeat.desc())).scalars().all()
        return [WorkerRow(worker_id=w.id, hostname=w.hostname, runner=w.runner, status=w.status, queues=w.queues,
                          last_heartbeat=w.last_heartbeat, current_job_id=w.current_job_id,
                          gpus=[str(g.get("name")) for g in (w.hardware or {}).get("gpus", [])],
                          slot=(w.hardware or {}).get("slot"), cpu=(w.hardware or {}).get("cpu", {})) for w in rows]


def live_workers(session: Session) -> list[tuple[HardwareJson, list[str]]]:
    """(hardware JSON, queues) of live workers (``farm.db.models.live_worker``)."""
    rows = session.execute(select(Worker.hardware, Worker.queues).where(live_worker())).all()
    return [(hw or HardwareJson(), queues or []) for hw, queues in rows]


def live_queues() -> set[str]:
    """Queues consumed by live workers."""
    with session_scope() as s:
        return {q for _, queues in live_workers(s) for q in queues}


def waiting_queues(request_id: str) -> dict[str, int]:
    """Queued jobs of the request whose queue no live worker consumes, counted by queue."""
    req = find_request(request_id)
    with session_scope() as s:
        rows = s.execute(select(Job.queue, func.count()).where(Job.request_id == req.id, Job.status == JobStatus.queued)
                         .group_by(Job.queue)).all()
    if not rows or get_settings().embedded:
        return {}
    live = live_queues()
    return {q: n for q, n in rows if q not in live}

"""Submitting a request: inspect the model, store it, expand, write request + jobs in one transaction,
then hand the jobs to the broker (cluster mode), in expansion order (with repeats: interleaved rounds,
``scheduler.expand.interleave``). Nothing is written when any step before fails."""
from __future__ import annotations

import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from farm import workload_files
from farm.artifacts import Intake, artifact_filename, check_storable, store_model, take_in
from farm.broker import Broker
from farm.db.models import Job, Request, RequestOwner, utcnow
from farm.db.session import session_scope
from farm.endpoint import FORMAT, Attach, describe_endpoint
from farm.errors import RequestError, SchedulerError
from farm.identity import Principal, audit
from farm.input_data import check_input_sizes, resolve_input_data
from farm.models.info import inspect_model, sha256_file
from farm.models.llm_info import check_fits
from farm.readers.results import live_workers
from farm.secrets import CREDENTIALS_HINT, credentials
from farm.settings import get_settings
from farm.store import references
from farm.store.base import STORE_PREFIX
from scheduler.expand import Expansion, ModelRef, expand, job_count
from scheduler.fairshare import check_limits
from schemas import JobSpec, ProfileRequest, TensorSpec
from schemas.engines import llm_format
from schemas.job import JobStatus

#: JobSpec fields that differ between the jobs of one request (the rest is dumped once per request)
_PER_JOB = ("job_id", "device", "engine", "protocol", "batch_size", "load", "concurrency", "edge_profile", "queue",
            "measurement", "repeat", "knobs")


@dataclass
class Submission:
    """What ``submit`` created: the request id, its jobs and the left-out combinations."""

    request_id: str
    expansion: Expansion
    request: ProfileRequest | None = None  # as expanded: its input data file read and checked
    files: list[workload_files.Upload] = field(default_factory=list)  # its workload files, stored with it


def online_gpu_products(session: Session) -> list[str]:
    """GPU product names advertised by live workers."""
    return [str(g.get("name", "")) for hw, _ in live_workers(session) for g in hw.get("gpus", [])]


def _model_ref(request: ProfileRequest, attach: Attach | None,
               intake: Intake | None = None) -> tuple[Path, ModelRef, int | None]:
    """The artifact to store, what expansion needs of it and an LLM's context length (tokens; None: unknown): the
    model file, or the endpoint's descriptor (``farm.endpoint``, its metadata read with ``attach``). With an
    ``intake`` (a submit), the model's files are staged in the store as the inspection hashes them."""
    if request.endpoint is not None:
        if attach is None:
            raise RequestError("profiling an endpoint needs its metadata reader: pass attach= "
                               "(the CLI passes workers.engines.triton.attach)")
        path, desc = describe_endpoint(request, attach)
        return path, ModelRef(sha256=sha256_file(path), format=FORMAT, filename=path.name, static_batch=
                              desc["static_batch"], inputs=tuple(TensorSpec.model_validate(t) for t in desc["inputs"])
                              ), desc.get("context_tokens")
    assert request.model is not None
    if references.is_reference(request.model):  # copied into this host's cache (an s3:// one is staged from there)
        path = references.resolve(request.model)
        intake = None if request.model.startswith(STORE_PREFIX) else intake  # store:sha256: in the store already
    else:
        path = Path(request.model).expanduser()
    if path.exists():  # FARM_MAX_MODEL_BYTES (and the store's free space) before a byte is read or written
        check_storable(path, store=intake.store if intake is not None else None)
    with intake.hashing() if intake is not None else nullcontext():
        info = inspect_model(path, request.format, request.inputs)
    return path, ModelRef(sha256=info.sha256, format=info.format, filename=artifact_filename(path),
                          inputs=tuple(info.inputs), static_batch=info.static_batch), info.context_tokens


def check_credential(request: ProfileRequest) -> None:
    """RequestError (one line) when the request names an endpoint credential that neither this host's operator
    (``FARM_ENDPOINT_CREDENTIALS``) nor a live worker (by name, in its registration) has set up."""
    llm = request.measurement.llm
    if llm is None or llm.credential is None:
        return
    known = set(credentials())
    if not get_settings().embedded:
        with session_scope() as s:
            known |= {str(n) for hw, _ in live_workers(s) for n in hw.get("credentials") or []}
    if llm.credential not in known:
        have = ", ".join(sorted(known)) or "none"
        raise RequestError(f"credential {llm.credential!r} is not set up (known: {have}); {CREDENTIALS_HINT}")


def plan(request: ProfileRequest, request_id: str | None = None, attach: Attach | None = None,
         gpu_products: list[str] | None = None, intake: Intake | None = None) -> tuple[Submission, Path, ModelRef]:
    """Inspect the model (or read the endpoint with ``attach``) and expand the request, touching nothing but
    the ``intake``'s staged (invisible) bytes; raises RequestError on bad input. ``gpu_products``: the GPUs to
    expand ``gpu`` to (None: those live workers advertise, read from the database)."""
    settings = get_settings()
    if request.measurement.timeout_s >= settings.visibility_timeout_s:
        raise RequestError(f"measurement timeout_s {request.measurement.timeout_s:g} must be below the broker "
                           f"visibility timeout ({settings.visibility_timeout_s} s, FARM_VISIBILITY_TIMEOUT_S)")
    if request.inputs:  # before the model is loaded (a dry run allocates its inputs)
        check_input_sizes(request.inputs, request.batch_sizes, settings.max_input_bytes)
    check_credential(request)
    if request.measurement.llm is not None:  # the host's cap first: before the model or endpoint is read
        workload_files.check_prompt_bounds(request.measurement.llm)
    path, ref, context = _model_ref(request, attach, intake)
    if llm_format(ref.format):  # weights over an edge box's memory: killed while loading
        check_fits(path, {p.name: p.memory for p in request.edge})
    if request.measurement.llm is not None:  # before anything is allocated, here or on a worker
        workload_files.check_prompt_bounds(request.measurement.llm, context, request.knob_configs())
    request, files = workload_files.prepare(request)
    check_input_sizes(ref.inputs, request.batch_sizes, settings.max_input_bytes)
    data = resolve_input_data(request.input_data, list(ref.inputs))
    if data is not request.input_data:
        request = request.model_copy(update={"input_data": data})
    rid = request_id or str(uuid.uuid4())
    products = gpu_products
    if products is None:
        with session_scope() as s:
            products = online_gpu_products(s)
    n_jobs = job_count(request, ref, products)  # arithmetic: a huge matrix is refused before it is built
    if n_jobs > settings.job_limit:
        raise RequestError(f"the request expands to {n_jobs} jobs, above the limit of "
                           f"{settings.job_limit}; shrink the matrix or raise FARM_JOB_LIMIT")
    expansion = expand(request, rid, ref, products)
    if not expansion.jobs:
        reasons = "; ".join(str(e["reason"]) for e in expansion.excluded) or "empty matrix"
        raise RequestError(f"the request expands to no runnable job: {reasons}")
    return Submission(rid, expansion, request, files), path, ref


def submit(request: ProfileRequest, send: bool | None = None, attach: Attach | None = None,
           owner: Principal | None = None, request_id: str | None = None, client_id: str | None = None,
           gpu_products: list[str] | None = None) -> Submission:
    """Store the model (or the descriptor of the endpoint, read with ``attach``: ``farm.endpoint``), the
    request and its jobs atomically; then enqueue them when a broker is set.

    A broker failure after the commit leaves the jobs ``queued`` in the database, where reconciliation
    re-enqueues them; it is reported as a SchedulerError.

    ``owner`` (the API's caller): the request is owned (``request_owners``, with ``client_id``, its idempotency
    key), checked against the owner's fair-share limits in the same transaction, and its jobs are held for
    ``scheduler.fairshare.release`` instead of being sent. ``request_id``: the id to give it (the API derives
    it from the owner and client id, so a submit retried after a crash finds the first one). ``gpu_products``: the
    GPUs ``gpu`` expands to (None: those live workers advertise; an embedded run passes this host's).
    """
    with take_in() as intake:  # the model read once: hashed while staged, published by store_model
        sub = _submit(request, owner, request_id, client_id, attach, gpu_products, intake)
    if owner is None and (send if send is not None else not get_settings().embedded):
        enqueue_jobs([(j.job_id, j.queue) for j in sub.expansion.jobs], request_id=sub.request_id)
    return sub


def _submit(request: ProfileRequest, owner: Principal | None, request_id: str | None, client_id: str | None,
            attach: Attach | None, gpu_products: list[str] | None, intake: Intake) -> Submission:
    """``submit``'s plan and transaction: the bytes published (``store_model``) before the rows commit."""
    sub, path, ref = plan(request, request_id=request_id, attach=attach, gpu_products=gpu_products, intake=intake)
    request = sub.request or request
    with session_scope() as s:
        if owner is not None:
            check_limits(s, owner, len(sub.expansion.jobs))
        store_model(s, path, ref.sha256, ref.format, [t.model_dump(mode="json") for t in ref.inputs], intake)
        workload_files.store(s, sub.files)
        s.add(Request(id=sub.request_id, name=request.name, model_sha256=ref.sha256,
                      spec=request.model_dump(mode="json"), excluded=sub.expansion.excluded))
        s.flush()
        if owner is not None:
            s.add(RequestOwner(request_id=sub.request_id, owner=owner.name, team=owner.team, priority=owner.priority,
                               client_id=client_id))
            audit(s, owner.name, "request.submit", sub.request_id, {"jobs": len(sub.expansion.jobs),
                                                                     "client_id": client_id})
        rows = job_rows(sub.request_id, sub.expansion.jobs)
        for i in range(0, len(rows), 2000):
            s.execute(insert(Job), rows[i:i + 2000])
    return sub


def spec_json(job: JobSpec, common: dict[str, Any] | None = None,
              dumped: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """``job.model_dump(mode="json")``, reusing ``common`` (the request-wide fields, dumped once) and
    ``dumped`` (measurement dumps by object id: the jobs of one serving configuration share one)."""
    if common is None:
        return job.model_dump(mode="json")
    out = dict(common)
    out.update(job_id=job.job_id, device=job.device, engine=job.engine, protocol=job.protocol,
               batch_size=job.batch_size, load=job.load.model_dump(mode="json"), concurrency=job.concurrency,
               queue=job.queue, repeat=job.repeat, knobs=dict(job.knobs),
               edge_profile=job.edge_profile.model_dump(mode="json") if job.edge_profile else None,
               measurement=_dump_measurement(job, dumped if dumped is not None else {}))
    return out


def _dump_measurement(job: JobSpec, dumped: dict[int, dict[str, Any]]) -> dict[str, Any]:
    key = id(job.measurement)
    if key not in dumped:
        dumped[key] = job.measurement.model_dump(mode="json")
    return dumped[key]


class JobInsertRow(TypedDict):
    """One row of the bulk insert into ``jobs``: the job's columns, its spec (JSON) and its queued state."""

    id: str
    request_id: str
    device: str
    engine: str
    batch_size: int
    concurrency: int
    rate: float | None
    edge_profile: str | None
    queue: str
    spec: dict[str, Any]
    status: JobStatus
    attempts: int
    created_at: datetime


def job_rows(request_id: str, jobs: list[JobSpec]) -> list[JobInsertRow]:
    """Rows for a bulk insert into ``jobs`` (status queued)."""
    if not jobs:
        return []
    common = jobs[0].model_dump(mode="json", exclude=set(_PER_JOB))
    now = utcnow()
    dumped: dict[int, dict[str, Any]] = {}
    return [JobInsertRow(id=j.job_id, request_id=request_id, device=j.device, engine=j.engine,
                         batch_size=j.batch_size, concurrency=j.concurrency, rate=j.rate,
                         edge_profile=j.edge_profile.name if j.edge_profile else None, queue=j.queue,
                         spec=spec_json(j, common, dumped), status=JobStatus.queued, attempts=0, created_at=now)
            for j in jobs]


def enqueue_jobs(jobs: list[tuple[str, str]], request_id: str | None = None) -> None:
    """Send (job id, queue) pairs to the broker in one batch and stamp ``enqueued_at`` (by request when
    ``request_id`` is given: one UPDATE)."""
    try:
        Broker().send_many(jobs)
    except Exception as exc:  # kombu/redis raise many types; the jobs stay queued in the ledger
        raise SchedulerError(f"the broker refused jobs ({type(exc).__name__}: {exc}); they stay queued in the "
                             "database and are re-enqueued by `farm scheduler`; check FARM_BROKER_URL") from exc
    now = utcnow()
    with session_scope() as s:
        if request_id is not None:
            s.execute(update(Job).where(Job.request_id == request_id, Job.status == JobStatus.queued)
                      .values(enqueued_at=now))
            return
        ids = [j for j, _ in jobs]
        for i in range(0, len(ids), 500):
            s.execute(update(Job).where(Job.id.in_(ids[i:i + 500])).values(enqueued_at=now))

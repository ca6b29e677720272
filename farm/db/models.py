"""ORM models. The results table has one column per registered metric (``schemas.metrics``)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    and_,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from farm.settings import get_settings
from schemas.hardware import HardwareJson
from schemas.job import JobStatus
from schemas.knobs import KnobValue
from schemas.llm_facts import LLM_FACT_COLUMNS
from schemas.metrics import JOB_METRICS
from schemas.result import PLACEMENT_COLUMNS
from schemas.worker import WorkerStatus

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Timezone-aware UTC now: the one clock for every timestamp farm writes."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """``TIMESTAMP WITH TIME ZONE`` that always returns aware UTC datetimes.

    SQLite keeps no zone and hands back naive values; Postgres answers in the session's zone. Both are
    read as, or converted to, UTC here, so no caller fixes up timestamps. A naive value written is taken
    as UTC. The column type on disk is ``DateTime(timezone=True)`` as before."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return _as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return _as_utc(value)


def _as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: UTCDateTime()}


class ModelArtifact(Base):
    """A model's metadata, content-addressed by sha256; its bytes are in the model store (``farm.store``), never
    here: ``location`` is the store's URL (``file:///...``, ``s3://bucket/prefix``; empty: the bytes were lost) and
    ``layout`` says how: ``file`` (one blob, ``sha256``) or ``folder`` (a ``farm.store.base.Manifest`` blob stored
    under ``sha256``, naming each file's blob)."""

    __tablename__ = "model_artifacts"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    filename: Mapped[str] = mapped_column(String(255))
    format: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    location: Mapped[str] = mapped_column(String(1024))
    layout: Mapped[str] = mapped_column(String(8), default="file")
    inputs: Mapped[list[Any]] = mapped_column(JSON)
    static_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Request(Base):
    """One profiling request as submitted; ``excluded`` lists left-out combinations with reasons."""

    __tablename__ = "requests"
    __table_args__ = (Index(None, "created_at"),)  # `farm status` lists the newest requests

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    model_sha256: Mapped[str] = mapped_column(ForeignKey("model_artifacts.sha256"))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    excluded: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    """One cell of the matrix. ``status`` follows ``schemas.JobStatus``; claims are one UPDATE. Its load is
    ``concurrency`` and, in open loop, ``rate`` (set at expansion from ``JobSpec.rate``)."""

    __tablename__ = "jobs"
    # by request (status, results), by status (reconciler, waiting queues), by worker (dead-worker requeue)
    __table_args__ = (Index(None, "request_id", "status"), Index(None, "status", "queue"), Index(None, "worker_id"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"))
    device: Mapped[str] = mapped_column(String(80))
    engine: Mapped[str] = mapped_column(String(32))
    batch_size: Mapped[int] = mapped_column(Integer)
    concurrency: Mapped[int] = mapped_column(Integer)
    rate: Mapped[float | None] = mapped_column(Float, nullable=True)  # open-loop requests/s; NULL: closed loop
    edge_profile: Mapped[str | None] = mapped_column(String(64), nullable=True)
    queue: Mapped[str] = mapped_column(String(120))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(120), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(nullable=True)
    claimed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Worker(Base):
    """A worker node: hardware JSON, the queues it consumes, and its heartbeat. ``status`` follows
    ``schemas.WorkerStatus``; whether it is live is :func:`live_worker`."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    hardware: Mapped[HardwareJson] = mapped_column(JSON)  # what the worker registered (typed as stored)
    queues: Mapped[list[Any]] = mapped_column(JSON)
    runner: Mapped[str] = mapped_column(String(16), default="process")
    status: Mapped[str] = mapped_column(String(16), default=WorkerStatus.online)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(default=utcnow)
    current_job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)


def heartbeat_cutoff(now: datetime | None = None, dead_after_s: float | None = None) -> datetime:
    """The oldest heartbeat of a live worker: ``now`` less ``dead_after_s`` (default
    ``FARM_WORKER_DEAD_AFTER_S``), s."""
    wait = dead_after_s if dead_after_s is not None else get_settings().worker_dead_after_s
    return (now or utcnow()) - timedelta(seconds=wait)


def live_worker(cutoff: datetime | None = None) -> ColumnElement[bool]:
    """The one rule of a live worker, as a SQL condition on ``workers``: online, with a heartbeat at or after
    ``cutoff`` (default :func:`heartbeat_cutoff`). Its negation is a dead one: offline, lost or silent."""
    return and_(Worker.status == WorkerStatus.online,
                Worker.last_heartbeat >= (cutoff if cutoff is not None else heartbeat_cutoff()))


_SQL_TYPES = {"float": Float, "int": BigInteger, "bool": Boolean}


class Result(Base):
    """One row per job (the primary key makes the write idempotent). Metric columns come from the registry;
    the placement columns (``schemas.Placement``) say where it was measured; ``details`` holds the latency
    histogram, windows, error counts and sampler series."""

    __tablename__ = "results"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"), index=True)
    worker_id: Mapped[str | None] = mapped_column(String(120), nullable=True)
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    slot: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_uuid: Mapped[str | None] = mapped_column(String(80), nullable=True)
    server_cpus: Mapped[str | None] = mapped_column(String(255), nullable=True)
    loadgen_cpus: Mapped[str | None] = mapped_column(String(255), nullable=True)
    host_shared: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    isolated: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # an LLM job's facts (``schemas.llm_facts.LlmFacts``; NULL for other jobs), migration 0010
    knobs: Mapped[dict[str, KnobValue] | None] = mapped_column(JSON, nullable=True)
    n_threads: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokenizer: Mapped[str | None] = mapped_column(Text, nullable=True)
    token_source: Mapped[str | None] = mapped_column(String(16), nullable=True)
    input_tokens: Mapped[str | None] = mapped_column(String(40), nullable=True)
    output_tokens: Mapped[str | None] = mapped_column(String(40), nullable=True)
    prefix_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    workload_seed: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    prompts: Mapped[str | None] = mapped_column(Text, nullable=True)
    server: Mapped[str | None] = mapped_column(String(200), nullable=True)  # migration 0013
    prefix_cache: Mapped[str | None] = mapped_column(String(8), nullable=True)  # migration 0016
    shared_prefix_pct: Mapped[float | None] = mapped_column(Float, nullable=True)  # migration 0016
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


for _m in JOB_METRICS:
    setattr(Result, _m.name, mapped_column(_m.name, _SQL_TYPES[_m.kind], nullable=True))
del _m
assert all(hasattr(Result, c) for c in PLACEMENT_COLUMNS), "a Placement field without its results column"
assert all(hasattr(Result, c) for c in LLM_FACT_COLUMNS), "an LlmFacts field without its results column"


class OpProfileRow(Base):
    """A job's op profile (``--op-profile``, ``schemas.op_profile.OpProfile``): its status and why it is missing,
    the totals per inference (ms), and the raw trace (Chrome/Perfetto JSON, gzip) when kept. ``farm ops JOB``
    reads it; the view ``job_ops`` joins its nodes to the job."""

    __tablename__ = "op_profiles"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    engine: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    batch_size: Mapped[int] = mapped_column(Integer, default=1)
    threads: Mapped[int] = mapped_column(Integer, default=0)
    warmup: Mapped[int] = mapped_column(Integer, default=0)
    iterations: Mapped[int] = mapped_column(Integer, default=0)
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    capped: Mapped[bool] = mapped_column(Boolean, default=False)
    node_sum_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    compute_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    profiled_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    overhead_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    trace_format: Mapped[str | None] = mapped_column(String(16), nullable=True)
    cpus: Mapped[str | None] = mapped_column(String(255), nullable=True)
    trace_gz: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class OpNodeRow(Base):
    """One node of a job's op profile (``schemas.op_profile.OpNode``), ``rank`` 0 = the most time."""

    __tablename__ = "op_nodes"

    job_id: Mapped[str] = mapped_column(ForeignKey("op_profiles.job_id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    op_type: Mapped[str] = mapped_column(String(120), index=True)
    exec_type: Mapped[str] = mapped_column(String(120), default="")
    provider: Mapped[str] = mapped_column(String(60), default="")
    calls: Mapped[float] = mapped_column(Float, default=0.0)
    self_ms_p50: Mapped[float] = mapped_column(Float, default=0.0)
    self_ms_p90: Mapped[float] = mapped_column(Float, default=0.0)
    share: Mapped[float] = mapped_column(Float, default=0.0)
    input_shapes: Mapped[str] = mapped_column(Text, default="")
    fused: Mapped[list[Any]] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16), default="executed")


class Identity(Base):
    """Who calls farm's API (``farm token create``): a person or a CI pipeline, its team, whether it is an admin,
    its release priority and its own fair-share limits (None: the operator's FARM_MAX_* settings). Its token is
    kept only as a sha256 (``farm.identity``); ``revoked_at`` set: the token no longer authenticates."""

    __tablename__ = "identities"

    name: Mapped[str] = mapped_column(String(120), primary_key=True)
    team: Mapped[str | None] = mapped_column(String(120), nullable=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_request_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class RequestOwner(Base):
    """The identity that submitted a request through the API (requests without a row were submitted by an
    operator on the database itself); ``client_id`` is the submitter's idempotency key, ``priority`` its
    identity's at submit. Jobs of owned requests are released to the broker by fair share."""

    __tablename__ = "request_owners"
    __table_args__ = (Index(None, "owner"), Index(None, "team"))

    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"), primary_key=True)
    owner: Mapped[str] = mapped_column(String(120))
    team: Mapped[str | None] = mapped_column(String(120), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    client_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


class AuditEntry(Base):
    """One change made through the API or by an operator's ``farm token``: who, what, on what, when."""

    __tablename__ = "audit_log"
    __table_args__ = (Index(None, "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    actor: Mapped[str] = mapped_column(String(120))
    action: Mapped[str] = mapped_column(String(40))
    target: Mapped[str | None] = mapped_column(String(200), nullable=True)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

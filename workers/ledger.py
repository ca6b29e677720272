"""The worker's side of the job ledger: atomic claims, state changes and idempotent result writes.

Statements are SQLAlchemy Core on the ``jobs``/``results`` tables (bound parameters, no ORM unit of work),
one short transaction each: a worker handles hundreds of jobs per second in the dispatch benchmark.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Engine, case, create_engine, literal, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from farm.db.models import Job, Result
from farm.db.session import get_engine
from farm.settings import get_settings
from schemas import JobResult, JobSpec

JOBS = Job.__table__
RESULTS = Result.__table__
ACTIVE = ("claimed", "running")


def now() -> datetime:
    return datetime.now(UTC)


@lru_cache(maxsize=8)
def _ledger_engine(url: str, relaxed: bool) -> Engine:
    """The worker's Postgres engine for ledger writes: no pre-ping (a dropped connection fails the statement,
    the pool discards it and the caller's retry gets a fresh one), and with ``relaxed`` commits that do not
    wait for the WAL flush."""
    options = "-c synchronous_commit=off" if relaxed else ""
    return create_engine(url, pool_size=2, max_overflow=2, isolation_level="AUTOCOMMIT",
                         connect_args={"options": options} if options else {})


@contextmanager
def _tx(relaxed: bool = False) -> Iterator[Connection]:
    """A connection for ONE statement, which is its own transaction (Postgres: autocommit, one round trip;
    SQLite: a transaction committed on success).

    ``relaxed``: commit without waiting for the WAL flush (Postgres). Used for claims and the running mark
    only: if Postgres crashes and loses one, the job is queued again (the worker's result write is refused
    and the reconciler re-sends it). Result writes stay fully durable."""
    url = get_settings().db_url
    if url.startswith("postgresql"):
        with _ledger_engine(url, relaxed).connect() as conn:
            yield conn
    else:
        with get_engine(url).begin() as conn:
            yield conn


def claim(job_id: str, worker_id: str) -> JobSpec | None:
    """Claim a queued job in one UPDATE; None when another delivery or worker already has it."""
    with _tx(relaxed=True) as conn:
        row = conn.execute(
            update(JOBS)
            .where(JOBS.c.id == job_id, JOBS.c.status == "queued")
            .values(status="claimed", worker_id=worker_id, attempts=JOBS.c.attempts + 1, claimed_at=now(),
                    error=None)
            .returning(JOBS.c.spec)
        ).first()
    return None if row is None else JobSpec.model_validate(row[0])


def set_status(job_id: str, worker_id: str, status: str, error: str | None = None) -> bool:
    """Move a job this worker holds to ``status``; False when the worker no longer holds it."""
    values: dict[str, Any] = {"status": status}
    if status == "running":
        values["started_at"] = now()
    if status in ("succeeded", "failed", "cancelled"):
        values["finished_at"] = now()
    if error is not None:
        values["error"] = error[:4000]
    with _tx(relaxed=status == "running") as conn:
        res = conn.execute(update(JOBS).where(JOBS.c.id == job_id, JOBS.c.worker_id == worker_id,
                                              JOBS.c.status.in_(ACTIVE)).values(**values))
        return res.rowcount == 1


def _insert(session: Session | Connection):  # type: ignore[no-untyped-def]
    bind = session.get_bind() if isinstance(session, Session) else session
    return pg_insert if bind.dialect.name == "postgresql" else sqlite_insert


def result_row(result: JobResult, request_id: str, worker_id: str) -> dict[str, Any]:
    """The results-table row for a JobResult: registered metrics as columns, the rest in details."""
    row: dict[str, Any] = {"job_id": result.job_id, "request_id": request_id, "worker_id": worker_id,
                           "details": result.details, "created_at": now()}
    row.update(result.metrics)  # names checked against schemas.metrics when the JobResult was built
    return row


def finish(spec: JobSpec, worker_id: str, result: JobResult, status: str = "succeeded",
           error: str | None = None) -> bool:
    """Write the result row and the final job state in one transaction.

    Idempotent per job: the result's primary key is the job id and a second write inserts nothing.
    Returns False when the job was no longer this worker's (then nothing is written).
    """
    row = result_row(result, spec.request_id, worker_id)
    values: dict[str, Any] = {"status": status, "finished_at": now()}
    if error is not None:
        values["error"] = error[:4000]
    mine = update(JOBS).where(JOBS.c.id == spec.job_id, JOBS.c.worker_id == worker_id, JOBS.c.status.in_(ACTIVE))
    with _tx() as conn:
        if conn.dialect.name == "postgresql":
            # one atomic statement: WITH done AS (UPDATE jobs ... RETURNING id) INSERT INTO results SELECT ...
            done = mine.values(**values).returning(JOBS.c.id).cte("done")
            names = [k for k in row if k != "job_id"]
            source = select(done.c.id, *(literal(row[k], type_=RESULTS.c[k].type) for k in names))
            ins = (pg_insert(RESULTS).from_select(["job_id", *names], source).add_cte(done)
                   .on_conflict_do_nothing(index_elements=["job_id"]).returning(RESULTS.c.job_id))
            return conn.execute(ins).first() is not None
        res = conn.execute(mine.values(**values))
        if res.rowcount != 1:
            conn.rollback()
            return False
        conn.execute(_insert(conn)(RESULTS).values(**row).on_conflict_do_nothing(index_elements=["job_id"]))
    return True


def release(job_id: str, worker_id: str, reason: str) -> bool:
    """Hand a job this worker holds back to the queue (worker shutting down): status queued, the attempt
    not counted. False when the worker no longer holds it."""
    with _tx() as conn:
        res = conn.execute(update(JOBS).where(JOBS.c.id == job_id, JOBS.c.worker_id == worker_id,
                                              JOBS.c.status.in_(ACTIVE))
                           .values(status="queued", worker_id=None, claimed_at=None, started_at=None,
                                   attempts=case((JOBS.c.attempts > 0, JOBS.c.attempts - 1), else_=0),
                                   error=reason[:4000], enqueued_at=now()))
        return res.rowcount == 1


def job_status(job_id: str) -> str | None:
    """The job's status (None when there is no such job)."""
    with get_engine().connect() as conn:
        return conn.execute(select(JOBS.c.status).where(JOBS.c.id == job_id)).scalar_one_or_none()

"""Job life cycle: every change of a job's status, in one place.

    queued -> claimed -> running -> succeeded | failed | cancelled
    claimed | running -> queued   (released by its worker, or requeued by reconciliation)
    claimed | running -> cancelled (interrupted: ``farm submit`` stopped by a signal) -> queued (``farm resume``)

Each change is one guarded UPDATE (``WHERE status IN ... AND worker_id = ...``) in SQLAlchemy Core, run on
the caller's ``Session`` or ``Connection`` (the caller owns the transaction): a worker and reconciliation
acting on the same job at the same moment win or lose cleanly, and every function says which (True/False).
A job ending without a measurement gets its one result row from the same failure path (``fail``), whether
the worker or reconciliation ends it; result rows are idempotent (``ON CONFLICT DO NOTHING``).
"""
from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, Connection, Table, and_, case, delete, literal, or_, select, update
from sqlalchemy.orm import Session

from farm import op_profile
from farm.db.models import Job, Result, utcnow
from farm.db.session import dialect_insert
from farm.secrets import scrub, scrub_text
from schemas import JobResult, JobSpec
from schemas.job import ACTIVE, JobStatus

Bind = Session | Connection
JOBS = cast(Table, Job.__table__)
RESULTS = cast(Table, Result.__table__)
ERROR_CHARS = 4000  # longest error message kept on the job row
INTERRUPTED = "interrupted: "
"""How the reason of a job cancelled by an interrupt begins (``interrupt``): ``farm resume`` runs those jobs
again, never the ones cancelled by ``farm cancel``."""


def _held(job_id: str, worker_id: str | None, statuses: Collection[str] = ACTIVE) -> ColumnElement[bool]:
    """The guard of a change: the job is in one of ``statuses`` and held by ``worker_id`` (None: by no one)."""
    holder = JOBS.c.worker_id.is_(None) if worker_id is None else JOBS.c.worker_id == worker_id
    return and_(JOBS.c.id == job_id, JOBS.c.status.in_(list(statuses)), holder)


def status_of(bind: Bind, job_id: str) -> str | None:
    """The job's status (None when there is no such job)."""
    return bind.execute(select(JOBS.c.status).where(JOBS.c.id == job_id)).scalar_one_or_none()


def claim(bind: Bind, job_id: str, worker_id: str) -> JobSpec | None:
    """queued -> claimed, counting the attempt; None when another delivery or worker already has it."""
    row = bind.execute(
        update(JOBS)
        .where(JOBS.c.id == job_id, JOBS.c.status == JobStatus.queued)
        .values(status=JobStatus.claimed, worker_id=worker_id, attempts=JOBS.c.attempts + 1, claimed_at=utcnow(),
                error=None)
        .returning(JOBS.c.spec)
    ).first()
    return None if row is None else JobSpec.model_validate(row[0])


def start(bind: Bind, job_id: str, worker_id: str) -> bool:
    """claimed -> running; False when the worker no longer holds the job (cancelled or requeued)."""
    res = bind.execute(update(JOBS).where(_held(job_id, worker_id))
                       .values(status=JobStatus.running, started_at=utcnow()))
    rows: int = res.rowcount  # type: ignore[attr-defined]
    return rows == 1


def release(bind: Bind, job_id: str, worker_id: str, reason: str) -> bool:
    """Hand a job the worker holds back to the queue (worker shutting down): the attempt is not counted.
    False when the worker no longer holds it."""
    return _to_queue(bind, job_id, worker_id, reason, uncount=True)


def requeue(bind: Bind, job_id: str, worker_id: str | None, reason: str, now: datetime | None = None) -> bool:
    """Take a job from a worker that will not finish it (reconciliation); the attempt stays counted.
    False when the job changed meanwhile."""
    return _to_queue(bind, job_id, worker_id, reason, uncount=False, now=now)


def _to_queue(bind: Bind, job_id: str, worker_id: str | None, reason: str, uncount: bool,
              now: datetime | None = None) -> bool:
    values: dict[str, Any] = {"status": JobStatus.queued, "worker_id": None, "claimed_at": None, "started_at": None,
                              "enqueued_at": now or utcnow(), "error": scrub_text(reason)[:ERROR_CHARS]}
    if uncount:
        values["attempts"] = case((JOBS.c.attempts > 0, JOBS.c.attempts - 1), else_=0)
    res = bind.execute(update(JOBS).where(_held(job_id, worker_id)).values(**values))
    rows: int = res.rowcount  # type: ignore[attr-defined]
    return rows == 1


def failure_result(job_id: str, reason: str) -> JobResult:
    """The result of a job that ended without a measurement: no metric, the reason in ``details.error``."""
    return JobResult(job_id=job_id, details={"error": reason})


def result_row(result: JobResult, request_id: str, worker_id: str | None,
               now: datetime | None = None) -> dict[str, Any]:
    """The results-table row for a JobResult: registered metrics, the placement and an LLM job's facts as
    columns, the rest in details."""
    row: dict[str, Any] = {"job_id": result.job_id, "request_id": request_id, "worker_id": worker_id,
                           "details": result.details, "created_at": now or utcnow()}
    row.update(result.metrics)  # names checked against schemas.metrics when the JobResult was built
    if result.placement is not None:
        row.update(result.placement.model_dump())
    if result.llm is not None:
        row.update(result.llm.columns())
    return row


def finish(bind: Bind, spec: JobSpec, worker_id: str, result: JobResult,
           status: JobStatus | str = JobStatus.succeeded, error: str | None = None) -> bool:
    """The worker's end of a job: its final ``status`` and its result row, in one atomic write.

    Idempotent per job (the result's key is the job id). False when the job was no longer this worker's;
    then nothing is written. An op profile in the result's details (``farm.op_profile``) is written with it."""
    details, prof, trace = op_profile.split(result.details)
    if prof is not None:
        result = result.model_copy(update={"details": details})
    done = _settle(bind, _held(spec.job_id, worker_id), JobStatus(status), error,
                   result_row(result, spec.request_id, worker_id))
    if done and prof is not None:
        op_profile.store(bind, spec.job_id, prof, trace)
    return done


def fail(bind: Bind, job_id: str, request_id: str, reason: str, worker_id: str | None, *,
         statuses: Collection[str] = ACTIVE, now: datetime | None = None) -> bool:
    """Reconciliation's end of a job that will not finish: the job held by ``worker_id`` (None: by no one)
    in one of ``statuses`` ends ``failed`` with ``reason`` and a result row holding it. False when the job
    changed meanwhile.

    The worker's own failures take the same path: ``finish(..., failure_result(job_id, reason), failed,
    reason)`` (through its retry and spool), i.e. the same result row and the same ``_settle`` write."""
    row = result_row(failure_result(job_id, reason), request_id, None, now)
    return _settle(bind, _held(job_id, worker_id, statuses), JobStatus.failed, reason, row, now)


def _settle(bind: Bind, guard: ColumnElement[bool], status: JobStatus, error: str | None,
            row: dict[str, Any], now: datetime | None = None) -> bool:
    """Move the job matching ``guard`` to a final ``status`` and insert its result ``row``, atomically. The
    one write of every job's end: its error and details are scrubbed of the worker's secrets here
    (``farm.secrets.scrub``), whoever wrote them."""
    values: dict[str, Any] = {"status": status, "finished_at": now or utcnow()}
    if error is not None:
        values["error"] = scrub_text(error)[:ERROR_CHARS]
    row = {**row, "details": scrub(row.get("details"))}
    mine = update(JOBS).where(guard).values(**values)
    ins = dialect_insert(bind, RESULTS)
    if _dialect(bind) == "postgresql":
        # one statement: WITH done AS (UPDATE jobs ... RETURNING id) INSERT INTO results SELECT ...
        done = mine.returning(JOBS.c.id).cte("done")
        names = [k for k in row if k != "job_id"]
        source = select(done.c.id, *(literal(row[k], type_=RESULTS.c[k].type) for k in names))
        stmt = (ins.from_select(["job_id", *names], source).add_cte(done)
                .on_conflict_do_nothing(index_elements=["job_id"]).returning(RESULTS.c.job_id))
        return bind.execute(stmt).first() is not None
    if bind.execute(mine).rowcount != 1:  # type: ignore[attr-defined]
        return False  # nothing was changed
    bind.execute(ins.values(**row).on_conflict_do_nothing(index_elements=["job_id"]))
    return True


def _dialect(bind: Bind) -> str:
    return (bind.get_bind() if isinstance(bind, Session) else bind).dialect.name


def cancel(bind: Bind, request_id: str, reason: str, now: datetime | None = None) -> tuple[list[str], list[str]]:
    """Cancel every job of a request not final yet, each with a result row holding ``reason``; returns the
    ids of the (waiting, active) jobs cancelled. Workers stop the active ones when they see the status.
    Waiting jobs include those cancelled by an interrupt: they take ``reason``, so ``resume`` leaves them."""
    now = now or utcnow()
    values = {"status": JobStatus.cancelled, "finished_at": now, "error": reason}
    waiting_now = and_(JOBS.c.request_id == request_id, JOBS.c.status == JobStatus.queued)
    interrupted = list(bind.execute(update(JOBS).where(_interrupted(request_id)).values(**values)
                                    .returning(JOBS.c.id)).scalars().all())
    if interrupted:
        bind.execute(delete(RESULTS).where(RESULTS.c.job_id.in_(interrupted)))
    ids: list[list[str]] = []
    for guard in (waiting_now, and_(JOBS.c.request_id == request_id, JOBS.c.status.in_(list(ACTIVE)))):
        ids.append(list(bind.execute(update(JOBS).where(guard).values(**values).returning(JOBS.c.id))
                        .scalars().all()))
    ids[0] += interrupted
    rows = [result_row(failure_result(j, reason), request_id, None, now) for j in [*ids[0], *ids[1]]]
    if rows:
        bind.execute(dialect_insert(bind, RESULTS).values(rows).on_conflict_do_nothing(index_elements=["job_id"]))
    return ids[0], ids[1]


def interrupt(bind: Bind, job_id: str, worker_id: str, why: str, now: datetime | None = None) -> bool:
    """The job held by ``worker_id`` (claimed or running) ends ``cancelled`` because the process running it
    was stopped (``why``, e.g. "SIGINT"), with a result row holding the reason; ``resume`` can run it again.
    False when the job was no longer active and held by that worker (it ended before the signal)."""
    reason = f"{INTERRUPTED}{why}; `farm resume` runs it again"
    row = result_row(failure_result(job_id, reason), _request_of(bind, job_id), worker_id, now)
    return _settle(bind, _held(job_id, worker_id), JobStatus.cancelled, reason, row, now)


def _request_of(bind: Bind, job_id: str) -> str:
    return str(bind.execute(select(JOBS.c.request_id).where(JOBS.c.id == job_id)).scalar_one())


def _interrupted(request_id: str) -> ColumnElement[bool]:
    """The request's jobs cancelled by an interrupt (their reason starts with ``INTERRUPTED``)."""
    return and_(JOBS.c.request_id == request_id, JOBS.c.status == JobStatus.cancelled,
                JOBS.c.error.startswith(INTERRUPTED, autoescape=True))


def resumable(bind: Bind, request_id: str) -> list[tuple[str, str]]:
    """(job id, queue) of the request's jobs ``resume`` would run: queued ones and those cancelled by an
    interrupt, in matrix order (as ``farm results`` lists them)."""
    queued = and_(JOBS.c.request_id == request_id, JOBS.c.status == JobStatus.queued)
    stmt = (select(JOBS.c.id, JOBS.c.queue).where(or_(queued, _interrupted(request_id)))
            .order_by(JOBS.c.edge_profile.is_not(None), JOBS.c.edge_profile, JOBS.c.device, JOBS.c.engine,
                      JOBS.c.batch_size, JOBS.c.concurrency))
    return [(str(i), str(q)) for i, q in bind.execute(stmt).all()]


def resume(bind: Bind, request_id: str, now: datetime | None = None) -> list[str]:
    """Put the request's jobs cancelled by an interrupt (reason starting with ``INTERRUPTED``) back to
    ``queued``, their result rows deleted and the interrupted attempt not counted; returns their ids.
    Jobs cancelled by ``farm cancel`` stay cancelled."""
    ids = list(bind.execute(
        update(JOBS).where(_interrupted(request_id))
        .values(status=JobStatus.queued, worker_id=None, claimed_at=None, started_at=None, finished_at=None,
                enqueued_at=now or utcnow(), error=None,
                attempts=case((JOBS.c.attempts > 0, JOBS.c.attempts - 1), else_=0))
        .returning(JOBS.c.id)).scalars().all())
    if ids:
        bind.execute(delete(RESULTS).where(RESULTS.c.job_id.in_(ids)))
    return ids

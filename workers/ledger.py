"""The worker's side of the job ledger: atomic claims, state changes and idempotent result writes."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from farm.db.models import Job, Result
from farm.db.session import session_scope
from farm.metrics import BY_NAME
from schemas import JobResult, JobSpec


def now() -> datetime:
    return datetime.now(timezone.utc)


def claim(job_id: str, worker_id: str) -> JobSpec | None:
    """Claim a queued job in one UPDATE; None when another delivery or worker already has it."""
    with session_scope() as s:
        res = s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "queued")
            .values(status="claimed", worker_id=worker_id, attempts=Job.attempts + 1, claimed_at=now(),
                    error=None)
            .returning(Job.spec)
        )
        row = res.first()
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
    with session_scope() as s:
        res = s.execute(update(Job).where(Job.id == job_id, Job.worker_id == worker_id,
                                          Job.status.in_(("claimed", "running"))).values(**values))
        return res.rowcount == 1


def _insert(session: Session):  # type: ignore[no-untyped-def]
    return pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert


def result_row(result: JobResult, request_id: str, worker_id: str) -> dict[str, Any]:
    """The results-table row for a JobResult: registered metrics as columns, the rest in details."""
    row: dict[str, Any] = {"job_id": result.job_id, "request_id": request_id, "worker_id": worker_id,
                           "details": result.details, "created_at": now()}
    for name, value in result.metrics.items():
        if name not in BY_NAME:
            raise KeyError(f"metric {name!r} is not registered in farm.metrics")
        row[name] = value
    return row


def finish(spec: JobSpec, worker_id: str, result: JobResult, status: str = "succeeded",
           error: str | None = None) -> bool:
    """Write the result row and the final job state in one transaction.

    Idempotent per job: the result's primary key is the job id and a second write inserts nothing.
    Returns False when the job was no longer this worker's (then nothing is written).
    """
    with session_scope() as s:
        values: dict[str, Any] = {"status": status, "finished_at": now()}
        if error is not None:
            values["error"] = error[:4000]
        res = s.execute(update(Job).where(Job.id == spec.job_id, Job.worker_id == worker_id,
                                          Job.status.in_(("claimed", "running"))).values(**values))
        if res.rowcount != 1:
            s.rollback()
            return False
        ins = _insert(s)(Result).values(**result_row(result, spec.request_id, worker_id))
        s.execute(ins.on_conflict_do_nothing(index_elements=["job_id"]))
    return True

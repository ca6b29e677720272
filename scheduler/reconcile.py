"""Reconciliation: the ledger (database) is the truth; workers and the broker are brought back in line.

One pass (``reconcile``):

* workers whose heartbeat stopped are marked ``lost``; the jobs they held (claimed/running) are requeued
  and sent again, or failed with the reason once they used ``max_attempts``;
* running jobs far past their time limit (``timeout_s`` + ``timeout_grace_s``) are failed;
* jobs ``queued`` in the database but absent from the broker for ``requeue_after_s`` (Redis flushed or
  restarted without persistence, a send that failed after the commit) are sent again.

Every state change is one guarded UPDATE (``WHERE status = ... AND worker_id = ...``), so a worker that
finishes at the same moment wins or loses cleanly; duplicate messages are harmless because a claim is
atomic. Final states get their one result row (``ON CONFLICT DO NOTHING``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from farm.db.models import Job, Result, Worker
from farm.db.session import session_scope
from farm.settings import Settings, get_settings

log = logging.getLogger("farm.scheduler")
ACTIVE = ("claimed", "running")


def utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(ts: datetime | None) -> datetime | None:
    return None if ts is None else (ts if ts.tzinfo else ts.replace(tzinfo=UTC))


@dataclass
class ReconcileReport:
    """What one pass changed (job ids)."""

    lost_workers: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any((self.lost_workers, self.requeued, self.failed, self.timed_out, self.resent))

    def summary(self) -> str:
        return (f"{len(self.lost_workers)} worker(s) lost, {len(self.requeued)} job(s) requeued, "
                f"{len(self.failed)} failed after max attempts, {len(self.timed_out)} timed out, "
                f"{len(self.resent)} re-sent to the broker")


def insert_failure_rows(session: Session, rows: list[tuple[str, str, str]]) -> None:
    """One result row per (job id, request id, reason) for jobs ending without a measurement; idempotent."""
    if not rows:
        return
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    ins = insert(Result).values([{"job_id": j, "request_id": r, "details": {"error": why},
                                            "created_at": utcnow()} for j, r, why in rows])
    session.execute(ins.on_conflict_do_nothing(index_elements=["job_id"]))


def _dead_workers(session: Session, cutoff: datetime) -> set[str]:
    rows = session.execute(select(Worker.id, Worker.status, Worker.last_heartbeat)).all()
    return {wid for wid, status, beat in rows if status != "online" or _aware(beat) < cutoff}


def requeue_orphans(settings: Settings, now: datetime, report: ReconcileReport,
                    dead_after_s: float | None = None) -> list[tuple[str, str]]:
    """Requeue (or fail, past max_attempts) jobs held by workers that stopped heartbeating; returns the
    (job id, queue) pairs to send again."""
    cutoff = now - timedelta(seconds=dead_after_s if dead_after_s is not None else settings.worker_dead_after_s)
    to_send: list[tuple[str, str]] = []
    with session_scope() as s:
        stale = s.execute(select(Worker.id).where(Worker.status == "online", Worker.last_heartbeat < cutoff)
                          ).scalars().all()
        if stale:
            s.execute(update(Worker).where(Worker.id.in_(stale), Worker.status == "online",
                                           Worker.last_heartbeat < cutoff).values(status="lost"))
            report.lost_workers.extend(stale)
    with session_scope() as s:
        held = s.execute(select(Job.id, Job.request_id, Job.queue, Job.worker_id, Job.attempts)
                         .where(Job.status.in_(ACTIVE))).all()
        if not held:
            return to_send
        dead = _dead_workers(s, cutoff)
        workers = dict(s.execute(select(Worker.id, Worker.current_job_id)
                                 .where(Worker.id.in_({h.worker_id for h in held if h.worker_id}))).all())
        known = set(workers)
        claimed_at = dict(s.execute(select(Job.id, Job.claimed_at).where(Job.id.in_([h.id for h in held]))).all())
        failures: list[tuple[str, str, str]] = []
        for job_id, request_id, queue, worker_id, attempts in held:
            abandoned = False
            if worker_id in known and worker_id not in dead:
                # a live worker that has long stopped reporting this job as its current one (e.g. its
                # claim went through but the database failed under the next step) will never finish it
                since = _aware(claimed_at.get(job_id))
                abandoned = workers[worker_id] != job_id and since is not None and since < cutoff
                if not abandoned:
                    continue
            if worker_id is None or worker_id not in known:
                # a claim by a worker that never registered: give it the same grace as a heartbeat
                claimed = _aware(claimed_at.get(job_id))
                if claimed is not None and claimed >= cutoff:
                    continue
            guard = and_(Job.id == job_id, Job.status.in_(ACTIVE),
                         Job.worker_id.is_(None) if worker_id is None else Job.worker_id == worker_id)
            why = (f"worker {worker_id} no longer works on it (attempt {attempts})" if abandoned else
                   f"worker {worker_id} stopped heartbeating during attempt {attempts}")
            if attempts >= settings.max_attempts:
                reason = f"{why}; gave up after {attempts} attempt(s) (FARM_MAX_ATTEMPTS={settings.max_attempts})"
                res = s.execute(update(Job).where(guard).values(status="failed", error=reason, finished_at=now))
                if res.rowcount == 1:
                    failures.append((job_id, request_id, reason))
                    report.failed.append(job_id)
            else:
                res = s.execute(update(Job).where(guard).values(
                    status="queued", worker_id=None, claimed_at=None, started_at=None, enqueued_at=now,
                    error=f"requeued: {why}"))
                if res.rowcount == 1:
                    to_send.append((job_id, queue))
                    report.requeued.append(job_id)
        insert_failure_rows(s, failures)
    for job_id in report.requeued:
        log.warning("job %s requeued: its worker stopped heartbeating", job_id)
    for job_id in report.failed:
        log.warning("job %s failed: its worker stopped heartbeating and it used its attempts", job_id)
    return to_send


def fail_overdue(settings: Settings, now: datetime, report: ReconcileReport) -> None:
    """Fail running jobs whose worker let them run past ``timeout_s`` + ``timeout_grace_s``."""
    with session_scope() as s:
        running = s.execute(select(Job.id, Job.request_id, Job.worker_id, Job.started_at, Job.spec)
                            .where(Job.status == "running")).all()
        failures: list[tuple[str, str, str]] = []
        for job_id, request_id, worker_id, started, spec in running:
            timeout = float(((spec or {}).get("measurement") or {}).get("timeout_s") or 600.0)
            if started is None or _aware(started) + timedelta(seconds=timeout + settings.timeout_grace_s) > now:
                continue
            reason = (f"time limit of {timeout:g} s exceeded and worker {worker_id} did not stop the job; raise "
                      "measurement.timeout_s or shorten the measurement")
            res = s.execute(update(Job).where(Job.id == job_id, Job.status == "running",
                                              Job.worker_id == worker_id)
                            .values(status="failed", error=reason, finished_at=now))
            if res.rowcount == 1:
                failures.append((job_id, request_id, reason))
                report.timed_out.append(job_id)
        insert_failure_rows(s, failures)


def resend_missing(settings: Settings, now: datetime, report: ReconcileReport) -> list[tuple[str, str]]:
    """(job id, queue) of jobs queued in the database, sent over ``requeue_after_s`` ago (or never), and
    absent from the broker's queues."""
    from farm.broker import Broker

    cutoff = now - timedelta(seconds=settings.requeue_after_s)
    with session_scope() as s:
        stale = s.execute(select(Job.id, Job.queue).where(
            Job.status == "queued",
            or_(Job.enqueued_at < cutoff, and_(Job.enqueued_at.is_(None), Job.created_at < cutoff)))).all()
    if not stale:
        return []
    present = Broker().queued_job_ids({q for _, q in stale})
    if present is None:  # a broker we cannot look into: only jobs never sent
        with session_scope() as s:
            never = set(s.execute(select(Job.id).where(Job.status == "queued", Job.enqueued_at.is_(None),
                                                       Job.created_at < cutoff)).scalars().all())
        missing = [(j, q) for j, q in stale if j in never]
    else:
        missing = [(j, q) for j, q in stale if j not in present]
    report.resent.extend(j for j, _ in missing)
    if missing:
        log.warning("%d queued job(s) were missing from the broker; sending them again", len(missing))
    return missing


def reconcile(settings: Settings | None = None, now: datetime | None = None, dead_after_s: float | None = None,
              judge_workers: bool = True) -> ReconcileReport:
    """One reconciliation pass (see the module docstring); sends what must be sent again.

    ``judge_workers=False`` skips the dead-worker step (right after a database outage, when heartbeats
    could not be written)."""
    from scheduler.enqueue import enqueue_jobs

    settings = settings or get_settings()
    now = now or utcnow()
    report = ReconcileReport()
    to_send = requeue_orphans(settings, now, report, dead_after_s) if judge_workers else []
    fail_overdue(settings, now, report)
    if not settings.embedded:
        to_send += resend_missing(settings, now, report)
        if to_send:
            enqueue_jobs(to_send)
    return report


def cancel_request(request_id: str) -> dict[str, Any]:
    """Cancel every job of a request not final yet: queued ones never run, claimed/running ones are
    stopped by their worker (its job watch sees the status). Returns counts and the ids still running."""
    from farm.results import find_request

    req = find_request(request_id)
    now = utcnow()
    reason = "cancelled by `farm cancel`"
    with session_scope() as s:
        queued = s.execute(update(Job).where(Job.request_id == req.id, Job.status == "queued")
                           .values(status="cancelled", finished_at=now, error=reason)
                           .returning(Job.id)).scalars().all()
        active = s.execute(update(Job).where(Job.request_id == req.id, Job.status.in_(ACTIVE))
                           .values(status="cancelled", finished_at=now, error=reason)
                           .returning(Job.id)).scalars().all()
        insert_failure_rows(s, [(j, req.id, reason) for j in [*queued, *active]])
    return {"request_id": req.id, "queued_cancelled": len(queued), "running_cancelled": len(active),
            "running_ids": list(active)}


def still_running(job_ids: list[str]) -> list[str]:
    """Those of ``job_ids`` a live worker still reports as its current job (its server not yet stopped)."""
    if not job_ids:
        return []
    with session_scope() as s:
        return list(s.execute(select(Worker.current_job_id).where(Worker.current_job_id.in_(job_ids),
                                                                  Worker.status == "online")).scalars().all())

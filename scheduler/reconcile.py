"""Reconciliation: the ledger (database) is the truth; workers and the broker are brought back in line.

One pass (``reconcile``):

* workers whose heartbeat stopped are marked ``lost``; the jobs they held (claimed/running) are requeued
  and sent again, or failed with the reason once they used ``max_attempts``;
* running jobs far past their time limit (``timeout_s`` + ``timeout_grace_s``) are failed;
* jobs ``queued`` in the database but absent from the broker for ``requeue_after_s`` (Redis flushed or
  restarted without persistence, a send that failed after the commit) are sent again.

This module decides WHAT changes; ``farm.lifecycle`` makes each change (one guarded UPDATE, so a worker
that finishes at the same moment wins or loses cleanly, and one result row per final state). Duplicate
messages are harmless because a claim is atomic.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, exists, or_, select, update
from sqlalchemy.orm import Session

from farm import lifecycle
from farm.broker import Broker
from farm.db.models import Job, RequestOwner, Worker, heartbeat_cutoff, live_worker, utcnow
from farm.db.session import session_scope
from farm.payloads import CancelAnswer
from farm.readers.results import find_request
from farm.settings import Settings, get_settings
from scheduler.enqueue import enqueue_jobs
from scheduler.search import advance_recent
from schemas.job import ACTIVE, JobStatus
from schemas.worker import WorkerStatus

log = logging.getLogger("farm.scheduler")


@dataclass
class ReconcileReport:
    """What one pass changed (job ids)."""

    lost_workers: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    search_steps: list[str] = field(default_factory=list)  # next quick-search steps enqueued

    @property
    def changed(self) -> bool:
        return any((self.lost_workers, self.requeued, self.failed, self.timed_out, self.resent, self.search_steps))

    def summary(self) -> str:
        return (f"{len(self.lost_workers)} worker(s) lost, {len(self.requeued)} job(s) requeued, "
                f"{len(self.failed)} failed after max attempts, {len(self.timed_out)} timed out, "
                f"{len(self.resent)} re-sent to the broker, {len(self.search_steps)} search step(s) enqueued")


def _dead_workers(session: Session, cutoff: datetime) -> set[str]:
    return set(session.execute(select(Worker.id).where(~live_worker(cutoff))).scalars())


def _orphaned(job_id: str, worker_id: str | None, attempts: int, claimed_at: datetime | None,
              workers: dict[str, str | None], dead: set[str], cutoff: datetime) -> str | None:
    """Why the held job will not be finished by its worker (None: leave it). ``workers`` maps the known
    holders to their current job; ``dead`` are the workers that stopped heartbeating before ``cutoff``."""
    if worker_id is not None and worker_id in workers and worker_id not in dead:
        # a live worker that has long stopped reporting this job as its current one (e.g. its claim went
        # through but the database failed under the next step) will never finish it
        if workers[worker_id] != job_id and claimed_at is not None and claimed_at < cutoff:
            return f"worker {worker_id} no longer works on it (attempt {attempts})"
        return None
    if (worker_id is None or worker_id not in workers) and claimed_at is not None and claimed_at >= cutoff:
        return None  # a claim by a worker that never registered: give it the same grace as a heartbeat
    return f"worker {worker_id} stopped heartbeating during attempt {attempts}"


def requeue_orphans(settings: Settings, now: datetime, report: ReconcileReport,
                    dead_after_s: float | None = None) -> list[tuple[str, str]]:
    """Requeue (or fail, past max_attempts) jobs held by workers that stopped heartbeating; returns the
    (job id, queue) pairs to send again."""
    cutoff = heartbeat_cutoff(now, dead_after_s if dead_after_s is not None else settings.worker_dead_after_s)
    to_send: list[tuple[str, str]] = []
    silent = and_(Worker.status == WorkerStatus.online, ~live_worker(cutoff))  # online, heartbeat stopped
    with session_scope() as s:
        stale = s.execute(select(Worker.id).where(silent)).scalars().all()
        if stale:
            s.execute(update(Worker).where(Worker.id.in_(stale), silent).values(status=WorkerStatus.lost))
            report.lost_workers.extend(stale)
    with session_scope() as s:
        held = s.execute(select(Job.id, Job.request_id, Job.queue, Job.worker_id, Job.attempts, Job.claimed_at)
                         .where(Job.status.in_(ACTIVE))).all()
        if not held:
            return to_send
        dead = _dead_workers(s, cutoff)
        workers = dict(s.execute(select(Worker.id, Worker.current_job_id)
                                 .where(Worker.id.in_({h.worker_id for h in held if h.worker_id}))).all())
        for job_id, request_id, queue, worker_id, attempts, claimed_at in held:
            why = _orphaned(job_id, worker_id, attempts, claimed_at, workers, dead, cutoff)
            if why is None:
                continue
            if attempts >= settings.max_attempts:
                reason = f"{why}; gave up after {attempts} attempt(s) (FARM_MAX_ATTEMPTS={settings.max_attempts})"
                if lifecycle.fail(s, job_id, request_id, reason, worker_id, now=now):
                    report.failed.append(job_id)
            elif lifecycle.requeue(s, job_id, worker_id, f"requeued: {why}", now):
                to_send.append((job_id, queue))
                report.requeued.append(job_id)
    for job_id in report.requeued:
        log.warning("job %s requeued: its worker stopped heartbeating", job_id)
    for job_id in report.failed:
        log.warning("job %s failed: its worker stopped heartbeating and it used its attempts", job_id)
    return to_send


def fail_overdue(settings: Settings, now: datetime, report: ReconcileReport) -> None:
    """Fail running jobs whose worker let them run past ``timeout_s`` + ``timeout_grace_s``."""
    with session_scope() as s:
        running = s.execute(select(Job.id, Job.request_id, Job.worker_id, Job.started_at, Job.spec)
                            .where(Job.status == JobStatus.running)).all()
        for job_id, request_id, worker_id, started, spec in running:
            timeout = float(((spec or {}).get("measurement") or {}).get("timeout_s") or 600.0)
            if started is None or started + timedelta(seconds=timeout + settings.timeout_grace_s) > now:
                continue
            reason = (f"time limit of {timeout:g} s exceeded and worker {worker_id} did not stop the job; raise "
                      "measurement.timeout_s or shorten the measurement")
            if lifecycle.fail(s, job_id, request_id, reason, worker_id, statuses=(JobStatus.running,), now=now):
                report.timed_out.append(job_id)


def resend_missing(settings: Settings, now: datetime, report: ReconcileReport) -> list[tuple[str, str]]:
    """(job id, queue) of jobs queued in the database, sent over ``requeue_after_s`` ago (or never), and
    absent from the broker's queues."""
    cutoff = now - timedelta(seconds=settings.requeue_after_s)
    never_sent = and_(Job.enqueued_at.is_(None), Job.created_at < cutoff, ~_owned())  # owned: held (fair share)
    with session_scope() as s:
        stale = s.execute(select(Job.id, Job.queue).where(
            Job.status == JobStatus.queued, or_(Job.enqueued_at < cutoff, never_sent))).all()
    if not stale:
        return []
    present = Broker().queued_job_ids({q for _, q in stale})
    if present is None:  # a broker we cannot look into: only jobs never sent
        with session_scope() as s:
            never = set(s.execute(select(Job.id).where(Job.status == JobStatus.queued, never_sent)).scalars().all())
        missing = [(j, q) for j, q in stale if j in never]
    else:
        missing = [(j, q) for j, q in stale if j not in present]
    report.resent.extend(j for j, _ in missing)
    if missing:
        log.warning("%d queued job(s) were missing from the broker; sending them again", len(missing))
    return missing


def _owned() -> ColumnElement[bool]:
    """The job belongs to a request submitted through the API: ``scheduler.fairshare`` sends it, not this."""
    return exists().where(RequestOwner.request_id == Job.request_id)


def reconcile(settings: Settings | None = None, now: datetime | None = None, dead_after_s: float | None = None,
              judge_workers: bool = True) -> ReconcileReport:
    """One reconciliation pass (see the module docstring); sends what must be sent again.

    ``judge_workers=False`` skips the dead-worker step (right after a database outage, when heartbeats
    could not be written)."""
    settings = settings or get_settings()
    now = now or utcnow()
    report = ReconcileReport()
    to_send = requeue_orphans(settings, now, report, dead_after_s) if judge_workers else []
    fail_overdue(settings, now, report)
    report.search_steps.extend(j for j, _ in advance_recent(now))
    if not settings.embedded:
        to_send += resend_missing(settings, now, report)
        if to_send:
            enqueue_jobs(to_send)
    return report


def cancel_request(request_id: str) -> CancelAnswer:
    """Cancel every job of a request not final yet: queued ones never run, claimed/running ones are
    stopped by their worker (its job watch sees the status). Returns counts and the ids still running."""
    req = find_request(request_id)
    now = utcnow()
    with session_scope() as s:
        queued, active = lifecycle.cancel(s, req.id, "cancelled by `farm cancel`", now)
    return CancelAnswer(request_id=req.id, queued_cancelled=len(queued), running_cancelled=len(active),
                        running_ids=list(active))


def still_running(job_ids: list[str]) -> list[str]:
    """Those of ``job_ids`` a live worker still reports as its current job (its server not yet stopped)."""
    if not job_ids:
        return []
    with session_scope() as s:
        return [j for j in s.execute(select(Worker.current_job_id).where(Worker.current_job_id.in_(job_ids),
                                                                         live_worker())).scalars()
                if j is not None]

"""Fair share between the submitters of a shared farm (requests submitted through the API, ``request_owners``).

* **Limits, at submit** (``check_limits``): the jobs one identity (or team, ``FARM_LIMITS_BY``) may have queued
  (``FARM_MAX_QUEUED_JOBS``) and the size of one request (``FARM_MAX_REQUEST_JOBS``), each overridable per
  identity (``farm token create --max-queued-jobs ...``); a submit past one is refused in one line.
* **Interleaving, at release** (``release``): an owned request's jobs are *held* in the database (queued, never
  sent: ``enqueued_at`` NULL) instead of being sent all at once. Each pass (``farm scheduler`` every
  ``FARM_RELEASE_INTERVAL_S``, and ``farm server`` right after a submit) tops each broker queue up to
  ``FARM_QUEUE_DEPTH`` waiting messages per live worker consuming it, one job at a time, from the submitter with
  the highest priority and, among equals, the fewest jobs in flight (sent, claimed or running). A large request
  then waits behind no one and no one waits behind it: a small request's jobs go out as soon as a worker frees a
  place. ``FARM_MAX_RUNNING_JOBS`` caps one submitter's jobs in flight.

Celery's Redis transport has no fairness between messages of one queue (a FIFO list per priority step), which
is why the order is decided here, before a message exists. Requests submitted on the database by an operator
(no owner) keep the old path: sent at once.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, func, select, update
from sqlalchemy.orm import Session

from farm.broker import Broker
from farm.db.models import Identity, Job, Request, RequestOwner, Worker, live_worker, utcnow
from farm.db.session import session_scope
from farm.errors import LimitError
from farm.identity import Principal
from farm.settings import Settings, get_settings
from schemas.job import ACTIVE, JobStatus

log = logging.getLogger("farm.scheduler")


def held() -> ColumnElement[bool]:
    """Jobs held for fair share: queued, never sent (the caller joins ``request_owners``)."""
    return and_(Job.status == JobStatus.queued, Job.enqueued_at.is_(None))


def _in_flight() -> ColumnElement[bool]:
    """Jobs sent to the broker and not final: waiting in a queue, claimed or running."""
    return (Job.status.in_(list(ACTIVE))) | and_(Job.status == JobStatus.queued, Job.enqueued_at.is_not(None))


def _key_column(by: str) -> ColumnElement[str | None]:
    return RequestOwner.team if by == "team" else RequestOwner.owner  # type: ignore[return-value]


def owned_jobs(session: Session, who: Principal, condition: ColumnElement[bool]) -> int:
    """How many jobs matching ``condition`` the identity (or its team, by ``Principal.limits_key``) has."""
    by, key = who.limits_key
    stmt = (select(func.count()).select_from(Job).join(RequestOwner, RequestOwner.request_id == Job.request_id)
            .where(condition, _key_column(by) == key))
    return int(session.execute(stmt).scalar_one())


def check_limits(session: Session, who: Principal, n_jobs: int, settings: Settings | None = None) -> None:
    """LimitError when a request of ``n_jobs`` jobs from ``who`` passes a limit (request size, queued jobs)."""
    settings = settings or get_settings()
    by, key = who.limits_key
    size = who.max_request_jobs if who.max_request_jobs is not None else settings.max_request_jobs
    if size and n_jobs > size:
        raise LimitError(f"the request expands to {n_jobs} jobs, above {by} {key!r}'s limit of {size} per request; "
                         "shrink the matrix (fewer batch sizes, concurrencies or repeats)")
    cap = who.max_queued_jobs if who.max_queued_jobs is not None else settings.max_queued_jobs
    queued = owned_jobs(session, who, Job.status == JobStatus.queued)
    if queued + n_jobs > cap:
        raise LimitError(f"{by} {key!r} has {queued} job(s) queued; {n_jobs} more would pass its limit of {cap}: "
                         "wait for them to run, or cancel a request (`farm cancel`)")


@dataclass
class _Submitter:
    """One submitter's standing in a release pass."""

    owner: str
    priority: int
    in_flight: int
    cap: int  # most jobs in flight (0: no limit)


def _room(session: Session, settings: Settings) -> dict[str, int]:
    """Per queue holding held jobs: how many more messages it takes (FARM_QUEUE_DEPTH per live consumer)."""
    queues = [q for (q,) in session.execute(select(Job.queue).join(RequestOwner, RequestOwner.request_id
                                                                   == Job.request_id).where(held()).distinct())]
    if not queues:
        return {}
    waiting = dict(session.execute(select(Job.queue, func.count()).where(
        Job.status == JobStatus.queued, Job.enqueued_at.is_not(None), Job.queue.in_(queues)).group_by(Job.queue)).all())
    consumers: Counter[str] = Counter()
    for (served,) in session.execute(select(Worker.queues).where(live_worker())):
        consumers.update(q for q in served or [] if q in queues)
    return {q: settings.queue_depth * max(1, consumers[q]) - int(waiting.get(q, 0)) for q in queues}


def _submitters(session: Session, settings: Settings) -> dict[str, _Submitter]:
    """Every owner with held jobs: its priority, jobs in flight and cap."""
    rows = session.execute(select(RequestOwner.owner, func.max(RequestOwner.priority)).join(
        Job, Job.request_id == RequestOwner.request_id).where(held()).group_by(RequestOwner.owner)).all()
    if not rows:
        return {}
    flying = dict(session.execute(select(RequestOwner.owner, func.count()).join(
        Job, Job.request_id == RequestOwner.request_id).where(_in_flight()).group_by(RequestOwner.owner)).all())
    caps = _caps(session, [o for o, _ in rows], settings)
    return {o: _Submitter(o, int(p or 0), int(flying.get(o, 0)), caps.get(o, settings.max_running_jobs))
            for o, p in rows}


def _caps(session: Session, owners: list[str], settings: Settings) -> dict[str, int]:
    """Each owner's cap of jobs in flight: its identity's own, else FARM_MAX_RUNNING_JOBS."""
    rows = session.execute(select(Identity.name, Identity.max_running_jobs).where(Identity.name.in_(owners))).all()
    return {n: cap for n, cap in rows if cap is not None}


def _next_jobs(session: Session, queue: str, owner: str, n: int) -> list[str]:
    """The owner's first ``n`` held jobs in ``queue``: highest priority, oldest request, matrix order."""
    stmt = (select(Job.id).join(RequestOwner, RequestOwner.request_id == Job.request_id)
            .join(Request, Request.id == Job.request_id)
            .where(held(), Job.queue == queue, RequestOwner.owner == owner)
            .order_by(RequestOwner.priority.desc(), Request.created_at, Job.created_at, Job.id).limit(n))
    return list(session.execute(stmt).scalars())


def plan_release(session: Session, settings: Settings) -> list[tuple[str, str]]:
    """(job id, queue) to release now, interleaved: round by round, the highest priority first, then the
    submitter with the fewest jobs in flight; pure reads."""
    room = {q: n for q, n in _room(session, settings).items() if n > 0}
    subs = _submitters(session, settings)
    picked: list[tuple[str, str]] = []
    for queue, n in sorted(room.items()):
        pending = {o: _next_jobs(session, queue, o, n) for o in subs}
        for _ in range(n):
            ready = [s for s in subs.values() if pending[s.owner] and (not s.cap or s.in_flight < s.cap)]
            if not ready:
                break
            best = min(ready, key=lambda s: (-s.priority, s.in_flight, s.owner))
            picked.append((pending[best.owner].pop(0), queue))
            best.in_flight += 1
    return picked


def release(settings: Settings | None = None) -> list[tuple[str, str]]:
    """Send the held jobs ``plan_release`` picks to the broker; returns them. Each job is marked sent
    (``enqueued_at``) by one guarded UPDATE before its message goes out, so two releasers (the scheduler and a
    server) never send one job twice; a send that fails leaves it marked, and reconciliation re-sends it after
    ``FARM_REQUEUE_AFTER_S`` (``scheduler.reconcile.resend_missing``)."""
    settings = settings or get_settings()
    if settings.embedded:
        return []
    with session_scope() as s:
        planned = plan_release(s, settings)
        if not planned:
            return []
        now = utcnow()
        mine = set(s.execute(update(Job).where(Job.id.in_([j for j, _ in planned]), held())
                             .values(enqueued_at=now).returning(Job.id)).scalars())
    sent = [(j, q) for j, q in planned if j in mine]
    if sent:
        Broker().send_many(sent)
        log.info("released %d held job(s) to the broker", len(sent))
    return sent

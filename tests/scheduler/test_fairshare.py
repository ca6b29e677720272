"""The fair-share release order (``scheduler.fairshare.plan_release``) on a SQLite ledger: round robin between
submitters of equal priority, the higher priority first, FARM_MAX_RUNNING_JOBS and the queue depth per live
worker; operators' requests are never held."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update


def _held_request(owner: str, n: int, model: Path, priority: int = 0) -> str:
    from farm.identity import Principal
    from scheduler.enqueue import submit
    from schemas import ProfileRequest

    req = ProfileRequest(model=str(model), batch_sizes=[1], concurrency=list(range(1, n + 1)))
    return submit(req, send=False, owner=Principal(owner, priority=priority)).request_id


def _owners(planned: list[tuple[str, str]]) -> list[str]:
    from farm.db.models import Job, RequestOwner
    from farm.db.session import session_scope

    with session_scope() as s:
        who = dict(s.query(Job.id, RequestOwner.owner).join(RequestOwner, RequestOwner.request_id == Job.request_id))
    return [who[j] for j, _ in planned]


def _worker(queues: list[str], n: int = 1) -> None:
    from farm.db.models import Worker
    from farm.db.session import session_scope

    with session_scope() as s:
        for i in range(n):
            s.add(Worker(id=f"w{i}", hostname="h", hardware={}, queues=queues))


def test_round_robin_priority_and_caps(sqlite_url: str, example_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.db.session import session_scope
    from farm.settings import get_settings, reset_settings
    from scheduler.fairshare import plan_release

    monkeypatch.setenv("FARM_QUEUE_DEPTH", "3")
    reset_settings()
    _held_request("alice", 8, example_onnx)
    _held_request("bob", 2, example_onnx)
    _worker(["farm.cpu"], 2)  # two live consumers: 2 x 3 places
    with session_scope() as s:
        order = _owners(plan_release(s, get_settings()))
    assert order == ["alice", "bob", "alice", "bob", "alice", "alice"]
    _held_request("ci", 3, example_onnx, priority=5)
    with session_scope() as s:
        assert _owners(plan_release(s, get_settings()))[:3] == ["ci", "ci", "ci"]
    monkeypatch.setenv("FARM_MAX_RUNNING_JOBS", "1")
    reset_settings()
    with session_scope() as s:
        assert sorted(_owners(plan_release(s, get_settings()))) == ["alice", "bob", "ci"]


def test_reconcile_never_sends_held_jobs(sqlite_url: str, example_onnx: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.db.models import Job, utcnow
    from farm.db.session import session_scope
    from farm.settings import get_settings, reset_settings
    from scheduler.fairshare import plan_release
    from scheduler.reconcile import ReconcileReport, resend_missing

    monkeypatch.setenv("FARM_BROKER_URL", "memory://")
    monkeypatch.setenv("FARM_REQUEUE_AFTER_S", "1")
    reset_settings()
    _held_request("alice", 4, example_onnx)
    with session_scope() as s:  # an hour old and never sent: an operator's job would be re-sent, a held one not
        s.execute(update(Job).values(created_at=utcnow() - timedelta(hours=1)))

    report = ReconcileReport()
    assert resend_missing(get_settings(), utcnow(), report) == [] and report.resent == []
    with session_scope() as s:
        assert len(plan_release(s, get_settings())) == 2  # the default depth, no live worker: 2 places


def test_an_api_requests_search_steps_are_held_too(sqlite_url: str, example_onnx: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A quick search adds steps as results land: those of an API request wait for fair share's release like its
    first ones (an operator's are sent at once, as before)."""
    from sqlalchemy import select

    from farm import lifecycle
    from farm.db.models import Job
    from farm.db.session import session_scope
    from farm.identity import Principal
    from farm.settings import reset_settings
    from scheduler.enqueue import submit
    from scheduler.search import advance
    from schemas import JobResult, ProfileRequest

    monkeypatch.setenv("FARM_BROKER_URL", "memory://")
    reset_settings()
    req = ProfileRequest(model=str(example_onnx), batch_sizes=[1], concurrency=[1, 2, 4, 8],
                         measurement={"search": "quick", "p99_ms": 1000})
    rid = submit(req, owner=Principal("alice")).request_id
    with session_scope() as s:
        first = s.execute(select(Job.id)).scalars().all()
        for job in first:
            spec = lifecycle.claim(s, job, "w")
            assert spec is not None and lifecycle.start(s, job, "w")
            lifecycle.finish(s, spec, "w", JobResult(job_id=job, metrics={"throughput_infer_per_s": 10.0,
                                                                           "latency_p99_ms": 5.0}))
    added = advance(rid)
    assert added
    with session_scope() as s:
        sent = s.execute(select(Job.enqueued_at).where(Job.id.in_([j for j, _ in added]))).scalars().all()
    assert sent == [None] * len(added)  # held: fair share releases them

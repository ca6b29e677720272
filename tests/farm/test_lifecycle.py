"""The job life cycle: every state change is one guarded UPDATE; one result row per job, whatever is delivered."""
from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from farm import lifecycle
from farm.db.models import Job, Result, Worker, utcnow
from farm.db.session import session_scope
from scheduler.enqueue import submit
from schemas import JobResult, JobSpec, ProfileRequest
from schemas.job import ACTIVE, FINAL, JobStatus


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest) -> str:
    fixture = "sqlite_url" if request.param == "sqlite" else "cluster_env"
    request.getfixturevalue(fixture)
    return request.param


def _submit(model: Path, n: int = 2) -> list[str]:
    sub = submit(ProfileRequest(model=str(model), batch_sizes=list(range(1, n + 1))), send=False)
    return [j.job_id for j in sub.expansion.jobs]


def _claim(job_id: str, worker_id: str) -> JobSpec | None:
    with session_scope() as s:
        return lifecycle.claim(s, job_id, worker_id)


def _job(job_id: str) -> Job:
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _result(job_id: str) -> Result | None:
    with session_scope() as s:
        return s.get(Result, job_id)


def test_status_sets() -> None:
    assert ACTIVE | FINAL | {JobStatus.queued} == set(JobStatus)
    assert not ACTIVE & FINAL
    assert JobStatus.failed == "failed" and JobStatus.failed.final and not JobStatus.running.final


def test_submit_writes_request_jobs_and_artifact(db: str, example_onnx: Path) -> None:
    ids = _submit(example_onnx, 3)
    with session_scope() as s:
        jobs = s.execute(select(Job).where(Job.id.in_(ids))).scalars().all()
        assert sorted(j.batch_size for j in jobs) == [1, 2, 3]
        assert {j.status for j in jobs} == {JobStatus.queued}
        assert lifecycle.status_of(s, ids[0]) == JobStatus.queued
        assert lifecycle.status_of(s, "no-such-job") is None


def test_a_job_is_claimed_once(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    first = _claim(job_id, "w1")
    assert first is not None and first.job_id == job_id
    assert _claim(job_id, "w2") is None
    job = _job(job_id)
    assert (job.status, job.worker_id, job.attempts) == (JobStatus.claimed, "w1", 1)


def test_concurrent_claims_have_one_winner(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        if _claim(job_id, f"w{i}") is not None:
            winners.append(f"w{i}")

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def test_start_needs_the_claim(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    with session_scope() as s:
        assert not lifecycle.start(s, job_id, "w1")  # queued -> running is not a transition
    assert _claim(job_id, "w1")
    with session_scope() as s:
        assert not lifecycle.start(s, job_id, "w2")  # not its job
        assert lifecycle.start(s, job_id, "w1")
    job = _job(job_id)
    assert job.status == JobStatus.running and job.started_at is not None


def test_result_write_is_idempotent(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    spec = _claim(job_id, "w1")
    assert spec is not None
    result = JobResult(job_id=job_id, metrics={"throughput_infer_per_s": 10.0, "stable": True})
    with session_scope() as s:
        assert lifecycle.finish(s, spec, "w1", result)
    with session_scope() as s:
        assert not lifecycle.finish(s, spec, "w1", result)  # the job is final: nothing more is written
        assert not lifecycle.finish(s, spec, "w2", result)
        assert not lifecycle.start(s, job_id, "w1")
        assert not lifecycle.release(s, job_id, "w1", "late")
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Result).where(Result.job_id == job_id)) == 1
        assert s.get(Job, job_id).status == JobStatus.succeeded
        assert s.get(Result, job_id).throughput_infer_per_s == 10.0


def test_release_hands_back_without_counting(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    assert _claim(job_id, "w1")
    with session_scope() as s:
        assert not lifecycle.release(s, job_id, "w2", "not mine")
        assert lifecycle.release(s, job_id, "w1", "shutting down")
    job = _job(job_id)
    assert (job.status, job.worker_id, job.attempts, job.error) == (JobStatus.queued, None, 0, "shutting down")
    assert job.claimed_at is None and job.enqueued_at is not None


def test_requeue_keeps_the_attempt(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    assert _claim(job_id, "w1")
    with session_scope() as s:
        assert lifecycle.start(s, job_id, "w1")
        assert lifecycle.requeue(s, job_id, "w1", "requeued: lost")
        assert not lifecycle.requeue(s, job_id, "w1", "again")  # no longer held
    job = _job(job_id)
    assert (job.status, job.worker_id, job.attempts, job.started_at) == (JobStatus.queued, None, 1, None)
    assert _claim(job_id, "w2") is not None and _job(job_id).attempts == 2


def test_fail_is_one_path_for_worker_and_reconciliation(db: str, example_onnx: Path) -> None:
    by_worker, by_cleanup = _submit(example_onnx, 2)
    spec = _claim(by_worker, "w1")
    assert spec and _claim(by_cleanup, "w2")
    with session_scope() as s:
        assert lifecycle.finish(s, spec, "w1", lifecycle.failure_result(by_worker, "boom"), JobStatus.failed,
                                "boom")
        assert not lifecycle.fail(s, by_cleanup, spec.request_id, "overdue", "w2",
                                  statuses=(JobStatus.running,))  # claimed, not running: left alone
        assert not lifecycle.fail(s, by_cleanup, spec.request_id, "lost", "w1")  # held by another worker
        assert lifecycle.fail(s, by_cleanup, spec.request_id, "lost", "w2")
        assert not lifecycle.fail(s, by_cleanup, spec.request_id, "lost", "w2")  # final: nothing more
    for job_id, reason, worker in ((by_worker, "boom", "w1"), (by_cleanup, "lost", None)):
        job, row = _job(job_id), _result(job_id)
        assert (job.status, job.error) == (JobStatus.failed, reason) and job.finished_at is not None
        assert row is not None and (row.details, row.worker_id) == ({"error": reason}, worker)


def test_fail_a_job_no_one_holds(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    with session_scope() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.claimed))
    with session_scope() as s:
        assert lifecycle.fail(s, job_id, _job(job_id).request_id, "never registered", None)
    assert _job(job_id).status == JobStatus.failed


def test_cancel_ends_queued_and_active_jobs_only(db: str, example_onnx: Path) -> None:
    queued, active, done = _submit(example_onnx, 3)
    spec = _claim(done, "w1")
    assert spec and _claim(active, "w2")
    with session_scope() as s:
        assert lifecycle.finish(s, spec, "w1", JobResult(job_id=done))
    with session_scope() as s:
        q, a = lifecycle.cancel(s, spec.request_id, "cancelled by test")
    assert (q, a) == ([queued], [active])
    assert _job(done).status == JobStatus.succeeded
    for job_id in (queued, active):
        assert _job(job_id).status == JobStatus.cancelled
        assert _result(job_id).details == {"error": "cancelled by test"}
    with session_scope() as s:
        assert not lifecycle.start(s, active, "w2")  # the worker learns it lost the job


def test_interrupt_then_resume_requeues_interrupted_jobs_not_user_cancelled_ones(db: str, example_onnx: Path) -> None:
    a, b, c = _submit(example_onnx, 3)  # batch sizes 1, 2, 3: matrix order
    done = _claim(c, "w1")
    assert done
    with session_scope() as s:
        assert lifecycle.finish(s, done, "w1", JobResult(job_id=c))
    assert _claim(a, "embedded")
    with session_scope() as s:
        assert lifecycle.start(s, a, "embedded")
        assert lifecycle.interrupt(s, a, "embedded", "farm submit stopped by SIGINT")
        assert not lifecycle.interrupt(s, a, "embedded", "again")  # no longer active: nothing changes
        assert not lifecycle.interrupt(s, c, "w1", "too late")  # finished before the signal
    job = _job(a)
    assert job.status == JobStatus.cancelled and job.error.startswith(lifecycle.INTERRUPTED) and "SIGINT" in job.error
    assert _result(a).details == {"error": job.error}
    with session_scope() as s:
        assert [j for j, _ in lifecycle.resumable(s, done.request_id)] == [a, b]
        assert lifecycle.resume(s, done.request_id) == [a]
    job = _job(a)
    assert (job.status, job.attempts, job.error, job.worker_id) == (JobStatus.queued, 0, None, None)
    assert _result(a) is None and _job(c).status == JobStatus.succeeded
    assert _claim(a, "embedded")  # runnable again
    with session_scope() as s:
        assert lifecycle.interrupt(s, a, "embedded", "farm submit stopped by SIGTERM")
    with session_scope() as s:  # `farm cancel` after an interrupt: the user does not want it run again
        assert lifecycle.cancel(s, done.request_id, "cancelled by test") == ([b, a], [])
    with session_scope() as s:
        assert lifecycle.resume(s, done.request_id) == []
        assert lifecycle.resumable(s, done.request_id) == []
    assert _job(a).error == "cancelled by test" and _result(a).details == {"error": "cancelled by test"}


def test_timestamps_are_aware_utc(db: str) -> None:
    naive = datetime(2026, 1, 2, 3, 4, 5)
    with session_scope() as s:
        s.add(Worker(id="w", hostname="h", hardware={}, queues=[], last_heartbeat=naive))
    with session_scope() as s:
        worker = s.get(Worker, "w")
        assert worker.last_heartbeat == naive.replace(tzinfo=UTC) and worker.last_heartbeat.tzinfo is UTC
        assert timedelta(0) <= utcnow() - worker.started_at < timedelta(minutes=1)

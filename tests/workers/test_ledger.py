"""The database is the ledger: one atomic claim per job, one result row per job, whatever is delivered."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import func, select

from farm.db.models import Job, Result
from farm.db.session import session_scope
from scheduler.enqueue import submit
from schemas import JobResult, ProfileRequest
from workers import ledger


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest) -> str:
    fixture = "sqlite_url" if request.param == "sqlite" else "cluster_env"
    request.getfixturevalue(fixture)
    return request.param


def _submit(model: Path, n: int = 2) -> list[str]:
    sub = submit(ProfileRequest(model=str(model), batch_sizes=list(range(1, n + 1))), send=False)
    return [j.job_id for j in sub.expansion.jobs]


def test_submit_writes_request_jobs_and_artifact(db: str, example_onnx: Path) -> None:
    ids = _submit(example_onnx, 3)
    with session_scope() as s:
        jobs = s.execute(select(Job).where(Job.id.in_(ids))).scalars().all()
        assert sorted(j.batch_size for j in jobs) == [1, 2, 3]
        assert {j.status for j in jobs} == {"queued"}


def test_a_job_is_claimed_once(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    first = ledger.claim(job_id, "w1")
    assert first is not None and first.job_id == job_id
    assert ledger.claim(job_id, "w2") is None
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert (job.status, job.worker_id, job.attempts) == ("claimed", "w1", 1)


def test_concurrent_claims_have_one_winner(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        if ledger.claim(job_id, f"w{i}") is not None:
            winners.append(f"w{i}")

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def test_result_write_is_idempotent(db: str, example_onnx: Path) -> None:
    job_id = _submit(example_onnx, 1)[0]
    spec = ledger.claim(job_id, "w1")
    assert spec is not None
    result = JobResult(job_id=job_id, metrics={"throughput_infer_per_s": 10.0, "stable": True})
    assert ledger.finish(spec, "w1", result)
    assert not ledger.finish(spec, "w1", result)  # the job is final: nothing more is written
    assert not ledger.finish(spec, "w2", result)
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Result).where(Result.job_id == job_id)) == 1
        assert s.get(Job, job_id).status == "succeeded"
        assert s.get(Result, job_id).throughput_infer_per_s == 10.0



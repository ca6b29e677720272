"""Results survive a database outage: retry with backoff, spool to disk, replay once, never twice."""
from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError, ProgrammingError

from farm.db.models import Job, Result
from farm.db.session import session_scope
from scheduler.enqueue import submit
from schemas import JobResult, ProfileRequest
from workers import ledger
from workers.execute import record, replay_spool
from workers.spool import Spool, SpooledResult, is_transient, retry_db


def _down() -> OperationalError:
    return OperationalError("UPDATE jobs", {}, Exception("connection refused"))


def test_retry_db_backs_off_then_succeeds() -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise _down()
        return "ok"

    assert retry_db(flaky, budget_s=60, first_s=0.1, max_s=0.3, sleep=sleeps.append) == "ok"
    assert sleeps == [0.1, 0.2, 0.3]


def test_retry_db_gives_up_after_its_budget_and_ignores_non_transient_errors() -> None:
    with pytest.raises(OperationalError):
        retry_db(lambda: (_ for _ in ()).throw(_down()), budget_s=0.05, first_s=0.01, max_s=0.01)
    calls: list[int] = []

    def bad_sql() -> None:
        calls.append(1)
        raise ProgrammingError("SELECT nope", {}, Exception("syntax error"))

    with pytest.raises(ProgrammingError):
        retry_db(bad_sql, budget_s=10, sleep=lambda s: None)
    assert calls == [1] and not is_transient(ProgrammingError("x", {}, Exception("y")))


def _claimed(example_onnx: Path, n: int = 2) -> list:  # type: ignore[type-arg]
    sub = submit(ProfileRequest(model=str(example_onnx), batch_sizes=list(range(1, n + 1))), send=False)
    specs = [ledger.claim(j.job_id, "w1") for j in sub.expansion.jobs]
    assert all(specs)
    return specs


def test_spooled_result_is_replayed_once(sqlite_url: str, example_onnx: Path, tmp_path: Path) -> None:
    spec = _claimed(example_onnx, 1)[0]
    spool = Spool(tmp_path / "spool")
    result = JobResult(job_id=spec.job_id, metrics={"throughput_infer_per_s": 5.0})
    item = SpooledResult(spec=spec, worker_id="w1", result=result, status="succeeded")
    path = spool.put(item)
    assert path.exists() and len(spool) == 1
    assert SpooledResult.from_json(__import__("json").loads(path.read_text())) == item
    assert replay_spool(spool) == 1
    assert len(spool) == 0
    spool.put(item)  # a second copy (e.g. a crash between the write and the delete) is harmless
    assert replay_spool(spool) == 1
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Result).where(Result.job_id == spec.job_id)) == 1
        assert s.get(Job, spec.job_id).status == "succeeded"
        assert s.get(Result, spec.job_id).throughput_infer_per_s == 5.0


def test_spooled_result_of_a_requeued_job_is_dropped(sqlite_url: str, example_onnx: Path, tmp_path: Path) -> None:
    spec = _claimed(example_onnx, 1)[0]
    assert ledger.release(spec.job_id, "w1", "test")  # meanwhile the job went back to the queue
    spool = Spool(tmp_path / "spool")
    spool.put(SpooledResult(spec=spec, worker_id="w1", result=JobResult(job_id=spec.job_id), status="succeeded"))
    assert replay_spool(spool) == 1 and len(spool) == 0
    with session_scope() as s:
        assert s.get(Result, spec.job_id) is None
        assert s.get(Job, spec.job_id).status == "queued"


def test_record_spools_when_the_database_is_unreachable(sqlite_url: str, example_onnx: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.settings import reset_settings

    spec = _claimed(example_onnx, 1)[0]
    spool = Spool(tmp_path / "spool")
    monkeypatch.setenv("FARM_DB_RETRY_S", "0.3")
    good = sqlite_url
    # the database goes away: nothing listens on port 1, a real connection-refused OperationalError
    monkeypatch.setenv("FARM_DATABASE_URL", "postgresql+psycopg2://farm:s3cret@127.0.0.1:1/farm")
    reset_settings()
    result = JobResult(job_id=spec.job_id, metrics={"stable": True})
    assert record(spec, "w1", result, "succeeded", None, spool) is True
    assert len(spool) == 1
    monkeypatch.setenv("FARM_DATABASE_URL", good)
    reset_settings()
    assert replay_spool(spool) == 1
    with session_scope() as s:
        assert s.get(Result, spec.job_id).stable is True


def test_corrupt_spool_file_is_set_aside(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    (tmp_path / "abc.json").write_text("{not json")
    assert spool.replay(lambda item: True) == 0
    assert (tmp_path / "abc.corrupt").exists() and len(spool) == 0


def test_spool_refuses_odd_job_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Spool(tmp_path).path_for("../../etc/passwd")

"""Reconciliation against real Postgres and Redis: dead workers, lost messages, overdue jobs, cancel, and
routing by the live inventory."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from farm.broker import Broker
from farm.db.models import Job, Result, Worker
from farm.db.session import session_scope
from farm.settings import get_settings, reset_settings
from scheduler.enqueue import online_gpu_products, submit
from scheduler.reconcile import cancel_request, reconcile, still_running
from scheduler.service import SchedulerService
from schemas import ProfileRequest
from workers import ledger

A100 = {"index": 0, "uuid": "GPU-1", "name": "NVIDIA A100-SXM4-40GB", "slug": "a100-sxm4-40gb",
        "memory_total_bytes": 40 << 30}


@pytest.fixture
def cluster(cluster_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("FARM_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("FARM_WORKER_DEAD_AFTER_S", "30")
    monkeypatch.setenv("FARM_REQUEUE_AFTER_S", "60")
    reset_settings()
    return cluster_env


def now() -> datetime:
    return datetime.now(UTC)


def add_worker(worker_id: str, beat_age_s: float = 0.0, queues: tuple[str, ...] = ("farm.cpu",),
               gpus: list[dict] | None = None, status: str = "online") -> None:
    hw = {"hostname": "h", "cpu": {"logical_cores": 2, "memory_bytes": 1 << 30}, "gpus": gpus or [],
          "queues": list(queues)}
    with session_scope() as s:
        s.add(Worker(id=worker_id, hostname="h", hardware=hw, queues=list(queues), runner="process", status=status,
                     last_heartbeat=now() - timedelta(seconds=beat_age_s)))


def jobs_of(model: Path, n: int = 1, send: bool = False, **req: object) -> tuple[str, list[str]]:
    sub = submit(ProfileRequest(model=str(model), batch_sizes=list(range(1, n + 1)), **req), send=send)
    return sub.request_id, [j.job_id for j in sub.expansion.jobs]


def job(job_id: str) -> Job:
    with session_scope() as s:
        return s.get(Job, job_id)


def test_job_of_a_dead_worker_is_requeued_and_sent_again(cluster: dict[str, str], example_onnx: Path) -> None:
    _, (jid,) = jobs_of(example_onnx)
    add_worker("dead", beat_age_s=120)
    assert ledger.claim(jid, "dead") and ledger.start(jid, "dead")
    report = reconcile()
    assert report.requeued == [jid] and report.lost_workers == ["dead"]
    j = job(jid)
    assert (j.status, j.worker_id, j.attempts) == ("queued", None, 1)
    assert "stopped heartbeating" in j.error
    assert Broker().queued_job_ids(["farm.cpu"]) == {jid}
    with session_scope() as s:
        assert s.get(Worker, "dead").status == "lost"
    assert not reconcile().changed  # a second pass finds nothing to do


def test_job_is_failed_with_the_reason_after_max_attempts(cluster: dict[str, str], example_onnx: Path) -> None:
    rid, (jid,) = jobs_of(example_onnx)
    add_worker("d1", beat_age_s=120)
    add_worker("d2", beat_age_s=120)
    assert ledger.claim(jid, "d1")
    assert reconcile().requeued == [jid]
    assert ledger.claim(jid, "d2")
    report = reconcile()
    assert report.failed == [jid] and not report.requeued
    j = job(jid)
    assert j.status == "failed" and j.attempts == 2 and "gave up after 2 attempt(s)" in j.error
    with session_scope() as s:
        assert s.get(Result, jid).details["error"] == j.error
    assert Broker().queued_job_ids(["farm.cpu"]) == {jid}  # only the one resend of the first requeue


def test_jobs_of_live_workers_and_unregistered_fresh_claims_are_left_alone(cluster: dict[str, str],
                                                                            example_onnx: Path) -> None:
    _, (a, b) = jobs_of(example_onnx, 2)
    add_worker("alive", beat_age_s=1)
    assert ledger.claim(a, "alive") and ledger.claim(b, "not-registered-yet")
    assert not reconcile().changed
    assert job(a).status == job(b).status == "claimed"
    later = reconcile(now=now() + timedelta(seconds=600))  # nobody beats for 10 minutes
    assert sorted(later.requeued) == sorted([a, b])


def test_job_a_live_worker_abandoned_is_requeued(cluster: dict[str, str], example_onnx: Path) -> None:
    from sqlalchemy import update

    _, (a, b) = jobs_of(example_onnx, 2)
    add_worker("busy", beat_age_s=0)
    assert ledger.claim(a, "busy") and ledger.claim(b, "busy")
    with session_scope() as s:  # its heartbeat reports b: it works on b, and has left a behind
        s.execute(update(Worker).where(Worker.id == "busy").values(current_job_id=b))
    assert not reconcile().changed  # claimed just now: it may not have reported it yet
    with session_scope() as s:
        s.execute(update(Job).where(Job.id.in_([a, b])).values(claimed_at=now() - timedelta(seconds=120)))
        s.execute(update(Worker).where(Worker.id == "busy").values(last_heartbeat=now()))
    report = reconcile()
    assert report.requeued == [a] and not report.lost_workers
    assert "no longer works on it" in job(a).error and job(b).status == "claimed"


def test_no_worker_is_judged_right_after_a_database_outage(cluster: dict[str, str], example_onnx: Path) -> None:
    _, (jid,) = jobs_of(example_onnx)
    add_worker("quiet", beat_age_s=120)
    assert ledger.claim(jid, "quiet")
    assert not reconcile(judge_workers=False).changed
    assert job(jid).status == "claimed"


def test_queued_job_missing_from_the_broker_is_sent_again(cluster: dict[str, str], example_onnx: Path) -> None:
    import redis

    _, ids = jobs_of(example_onnx, 3, send=True)
    assert Broker().queued_job_ids(["farm.cpu"]) == set(ids)
    assert not reconcile(now=now() + timedelta(seconds=120)).resent  # all present: nothing duplicated
    redis.Redis.from_url(cluster["FARM_BROKER_URL"]).flushdb()
    assert not reconcile().resent  # too recent: a worker may be taking it right now
    report = reconcile(now=now() + timedelta(seconds=120))
    assert sorted(report.resent) == sorted(ids)
    assert Broker().queued_job_ids(["farm.cpu"]) == set(ids)
    with session_scope() as s:
        assert all(j.status == "queued" for j in s.execute(select(Job).where(Job.id.in_(ids))).scalars())


def test_running_job_far_past_its_time_limit_is_failed(cluster: dict[str, str], example_onnx: Path) -> None:
    _, (jid,) = jobs_of(example_onnx, measurement={"timeout_s": 5})
    add_worker("stuck", beat_age_s=0)
    assert ledger.claim(jid, "stuck") and ledger.start(jid, "stuck")
    assert not reconcile().timed_out
    report = reconcile(now=now() + timedelta(seconds=5 + get_settings().timeout_grace_s + 1),
                       judge_workers=False)
    assert report.timed_out == [jid]
    assert job(jid).status == "failed" and "time limit of 5 s exceeded" in job(jid).error
    assert not ledger.finish(ledger.JobSpec.model_validate(job(jid).spec), "stuck",
                             ledger.JobResult(job_id=jid))  # the stuck worker's late result is refused


def test_cancel_request_cancels_queued_and_running_jobs_once(cluster: dict[str, str], example_onnx: Path) -> None:
    rid, (a, b, c) = jobs_of(example_onnx, 3)
    add_worker("w", beat_age_s=0)
    spec = ledger.claim(a, "w")
    assert spec and ledger.start(a, "w")
    spec_c = ledger.claim(c, "w")
    assert spec_c and ledger.finish(spec_c, "w", ledger.JobResult(job_id=c, metrics={"stable": True}))
    out = cancel_request(rid[:8])
    assert out["queued_cancelled"] == 1 and out["running_cancelled"] == 1 and out["running_ids"] == [a]
    assert (job(a).status, job(b).status, job(c).status) == ("cancelled", "cancelled", "succeeded")
    assert not ledger.finish(spec, "w", ledger.JobResult(job_id=a))  # the stopped run writes nothing
    assert ledger.claim(b, "w") is None  # a late delivery of the queued job does not run it
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Result).where(Result.request_id == rid)) == 3
        assert s.get(Result, c).stable is True
    assert cancel_request(rid)["queued_cancelled"] == 0
    assert still_running([a]) == []


def test_service_pass_survives_an_unreachable_database(cluster: dict[str, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_DATABASE_URL", "postgresql+psycopg2://farm:s3cret@127.0.0.1:1/farm")
    reset_settings()
    service = SchedulerService(interval_s=0.1)
    assert service.run_once() is None and service.failures == 1
    monkeypatch.setenv("FARM_DATABASE_URL", cluster["FARM_DATABASE_URL"])
    reset_settings()
    assert service.run_once() is not None and service.passes == 1


def test_device_selectors_resolve_against_live_workers(cluster: dict[str, str], example_onnx: Path) -> None:
    add_worker("gpu-box", gpus=[A100], queues=("farm.cpu", "farm.gpu.a100-sxm4-40gb"))
    add_worker("old-gpu-box", beat_age_s=3600, gpus=[{**A100, "name": "Tesla T4", "slug": "t4"}])
    with session_scope() as s:
        assert online_gpu_products(s) == ["NVIDIA A100-SXM4-40GB"]  # the stale worker does not count
    rid, ids = jobs_of(example_onnx, devices=["cpu", "gpu"])
    with session_scope() as s:
        queues = sorted(s.execute(select(Job.queue).where(Job.request_id == rid)).scalars())
    assert queues == ["farm.cpu", "farm.gpu.a100-sxm4-40gb"]


def test_job_no_live_worker_can_serve_waits_and_status_says_so(cluster: dict[str, str], example_onnx: Path) -> None:
    from farm.readers.results import waiting_queues
    from tests.helpers import farm, farm_env

    add_worker("cpu-box", queues=("farm.cpu",))
    rid, _ = jobs_of(example_onnx, devices=["cpu", "gpu:h100"])
    assert waiting_queues(rid) == {"farm.gpu.h100": 1}
    env = farm_env(**cluster)
    out = farm("status", rid, env=env).stdout
    assert "1 job(s) wait in queue farm.gpu.h100: no live worker consumes it" in " ".join(out.split())
    assert json.loads(farm("status", rid, "--json", env=env).stdout)["waiting"] == {"farm.gpu.h100": 1}
    add_worker("h100-box", queues=("farm.gpu.h100",), gpus=[{**A100, "name": "NVIDIA H100", "slug": "h100"}])
    assert waiting_queues(rid) == {}
    with session_scope() as s:
        s.execute(__import__("sqlalchemy").update(Worker).where(Worker.id == "h100-box")
                  .values(last_heartbeat=now() - timedelta(seconds=3600)))
    assert waiting_queues(rid) == {"farm.gpu.h100": 1}  # its worker stopped heartbeating


def test_one_live_worker_rule_for_every_reader(cluster: dict[str, str], example_onnx: Path) -> None:
    """Online with a fresh heartbeat is live; offline, lost or silent is dead, for reconciliation (dead
    holders), the inventory (live queues) and ``still_running`` alike."""
    from farm.db.models import live_worker
    from farm.readers.results import live_queues
    from schemas import WorkerStatus

    add_worker("live", queues=("q.live",))
    add_worker("silent", beat_age_s=120, queues=("q.silent",))
    add_worker("gone", status=WorkerStatus.offline, queues=("q.gone",))
    add_worker("was-lost", status=WorkerStatus.lost, queues=("q.lost",))
    with session_scope() as s:
        assert set(s.execute(select(Worker.id).where(live_worker())).scalars()) == {"live"}
        for wid in ("live", "silent", "gone", "was-lost"):
            s.get(Worker, wid).current_job_id = f"job-{wid}"
    assert live_queues() == {"q.live"}
    assert still_running([f"job-{w}" for w in ("live", "silent", "gone", "was-lost")]) == ["job-live"]
    assert reconcile().lost_workers == ["silent"]  # only an online worker is marked lost
    with session_scope() as s:
        assert {w.id: w.status for w in s.execute(select(Worker)).scalars()} == {
            "live": WorkerStatus.online, "silent": WorkerStatus.lost, "gone": WorkerStatus.offline,
            "was-lost": WorkerStatus.lost}

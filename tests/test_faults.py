"""The farm under faults, with real processes, Redis and Postgres: nothing lost, nothing run twice.

Most tests use the dispatch harness (FARM_NOOP_JOBS=1: workers complete jobs without serving, optionally
sleeping FARM_NOOP_SLEEP_S) so that a fault can be placed mid-job deterministically and fast; the
cancellation test runs a real model server. Each test runs a real ``farm scheduler`` subprocess with
short thresholds.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import func, select

from farm.db.models import Job, Result, Worker
from farm.db.session import session_scope
from scheduler.enqueue import submit
from schemas import ProfileRequest
from schemas.job import FINAL
from tests.helpers import farm, farm_env, start_worker
from workers.cancel import INTERRUPT_SIGNAL

pytestmark = pytest.mark.slow

FAST = {"max_windows": 2, "min_windows": 1, "window_s": 0.2, "warmup_s": 0.1}
FAULT_SETTINGS = {
    "FARM_NOOP_JOBS": "1", "FARM_HEARTBEAT_S": "0.5", "FARM_WORKER_DEAD_AFTER_S": "3", "FARM_REQUEUE_AFTER_S": "2",
    "FARM_RECONCILE_INTERVAL_S": "0.5", "FARM_CANCEL_POLL_S": "0.3", "FARM_DB_RETRY_S": "3",
    "FARM_MAX_ATTEMPTS": "30", "FARM_RUNNER": "process",
}


@pytest.fixture
def env(cluster_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Subprocess environment: the cluster plus fast fault-handling settings (also set in this process)."""
    from farm.settings import reset_settings

    for k, v in FAULT_SETTINGS.items():
        monkeypatch.setenv(k, v)
    reset_settings()
    return farm_env(**cluster_env, **FAULT_SETTINGS)


class Procs:
    """Subprocesses started by a test, all stopped at the end (SIGTERM, then SIGKILL)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []

    def worker(self, env: dict[str, str], name: str, *args: str, **extra: str) -> subprocess.Popen[str]:
        p = start_worker({**env, **extra}, "--worker-id", name, *args, log=self.tmp / f"{name}.log")
        self.procs.append(p)
        return p

    def scheduler(self, env: dict[str, str]) -> subprocess.Popen[str]:
        out = open(self.tmp / "scheduler.log", "w")  # noqa: SIM115
        p = subprocess.Popen([sys.executable, "-m", "farm", "scheduler"], env=env, stdout=out,
                             stderr=subprocess.STDOUT, text=True)
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.tmp.glob("*.log")))

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.stop_all()


def submit_jobs(model: Path, n: int, **measurement: float) -> tuple[str, list[str]]:
    """Submit a request of ``n`` jobs (batch sizes 1..n) and send them to the broker."""
    sub = submit(ProfileRequest(model=str(model), batch_sizes=list(range(1, n + 1)),
                                measurement={**FAST, **measurement}))
    return sub.request_id, [j.job_id for j in sub.expansion.jobs]


def counts(request_id: str) -> dict[str, int]:
    with session_scope() as s:
        rows = s.execute(select(Job.status, func.count()).where(Job.request_id == request_id)
                         .group_by(Job.status)).all()
    return {k: v for k, v in rows}


def wait_for(cond: Callable[[], bool], timeout: float, what: str, procs: Procs | None = None,
             poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception:  # the database may be restarting
            pass
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{procs.logs() if procs else ''}")


def all_final(request_id: str, n: int) -> bool:
    c = counts(request_id)
    return sum(c.get(s, 0) for s in FINAL) == n


def assert_one_result_each(request_id: str, job_ids: list[str]) -> None:
    with session_scope() as s:
        per_job = dict(s.execute(select(Result.job_id, func.count()).where(Result.request_id == request_id)
                                 .group_by(Result.job_id)).all())
    assert set(per_job) == set(job_ids), f"jobs without a result row: {set(job_ids) - set(per_job)}"
    assert set(per_job.values()) == {1}


def running_on(worker_id: str) -> bool:
    with session_scope() as s:
        return s.scalar(select(func.count()).select_from(Job).where(Job.status == "running",
                                                                    Job.worker_id == worker_id)) > 0


def test_kill_9_a_worker_mid_job_20_times(env: dict[str, str], procs: Procs, example_onnx: Path) -> None:
    kills = 20
    rid, job_ids = submit_jobs(example_onnx, 6)
    procs.scheduler(env)
    for i in range(kills):
        name = f"victim-{i}"
        w = procs.worker(env, name, FARM_NOOP_SLEEP_S="3")
        wait_for(lambda name=name: running_on(name), 60, f"{name} to run a job", procs)
        os.kill(w.pid, signal.SIGKILL)
        w.wait(timeout=10)
    for i in range(2):
        procs.worker(env, f"survivor-{i}", FARM_NOOP_SLEEP_S="0.2")
    wait_for(lambda: all_final(rid, len(job_ids)), 120, "all jobs to finish", procs, poll=0.5)
    assert counts(rid) == {"succeeded": len(job_ids)}, procs.logs()
    assert_one_result_each(rid, job_ids)
    with session_scope() as s:
        attempts = s.scalar(select(func.sum(Job.attempts)).where(Job.request_id == rid))
        finishers = set(s.execute(select(Job.worker_id).where(Job.request_id == rid)).scalars())
        lost = s.scalar(select(func.count()).select_from(Worker).where(Worker.status == "lost"))
    # every kill cost exactly one attempt; every job then ran to completion exactly once
    assert attempts == kills + len(job_ids)
    assert finishers <= {"survivor-0", "survivor-1"}
    assert lost == kills


def test_redis_flushed_with_100_jobs_queued_all_complete(env: dict[str, str], procs: Procs,
                                                        example_onnx: Path) -> None:
    import redis

    rid, job_ids = submit_jobs(example_onnx, 100)
    procs.scheduler(env)
    for i in range(2):
        procs.worker(env, f"w{i}", FARM_NOOP_SLEEP_S="0.1")
    wait_for(lambda: counts(rid).get("succeeded", 0) >= 5, 60, "the first jobs", procs)
    redis.Redis.from_url(env["FARM_BROKER_URL"]).flushdb()  # Redis restarted without persistence
    flushed_at = counts(rid)
    wait_for(lambda: all_final(rid, 100), 180, "all 100 jobs", procs, poll=0.5)
    assert flushed_at.get("queued", 0) > 0, "the flush came too late to lose anything"
    assert counts(rid) == {"succeeded": 100}, procs.logs()
    assert_one_result_each(rid, job_ids)
    with session_scope() as s:
        assert s.scalar(select(func.max(Job.attempts)).where(Job.request_id == rid)) == 1
    assert "missing from the broker" in procs.log("scheduler")


def _pg_ctl(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action], check=True,
                   capture_output=True, timeout=120)


def _pg_answers() -> bool:
    from tests.conftest import _answers

    return _answers("127.0.0.1", 5432)


def _drop_dead_connections() -> None:
    """After the restart every pooled connection in this process is dead: dispose of them all (farm's
    engines and the session fixtures' admin engine), so the next use connects afresh."""
    import gc
    import warnings

    from sqlalchemy import Engine

    with warnings.catch_warnings():  # isinstance() on torch's deprecated torch.distributed.reduce_op warns
        warnings.simplefilter("ignore", FutureWarning)
        engines = [obj for obj in gc.get_objects() if isinstance(obj, Engine)]
    for engine in engines:
        engine.dispose()


@pytest.mark.stops_postgres
@pytest.mark.skipif(not os.path.isdir("/etc/postgresql") or os.geteuid() != 0,
                    reason="needs a local Postgres cluster managed by pg_ctlcluster (root)")
def test_postgres_down_30s_during_a_run_loses_no_result(env: dict[str, str], procs: Procs,
                                                      example_onnx: Path) -> None:
    rid, job_ids = submit_jobs(example_onnx, 12)
    procs.scheduler(env)
    for i in range(2):
        procs.worker(env, f"w{i}", FARM_NOOP_SLEEP_S="1")
    wait_for(lambda: counts(rid).get("succeeded", 0) >= 2 and counts(rid).get("running", 0) >= 1, 60,
             "jobs to run", procs)
    try:
        _pg_ctl("stop")
        time.sleep(30)
    finally:
        _pg_ctl("start")
        deadline = time.monotonic() + 60
        while not _pg_answers() and time.monotonic() < deadline:
            time.sleep(0.5)
        _drop_dead_connections()
    wait_for(lambda: all_final(rid, len(job_ids)), 180, "all jobs after the outage", procs, poll=0.5)
    assert counts(rid) == {"succeeded": len(job_ids)}, procs.logs()
    assert_one_result_each(rid, job_ids)
    worker_logs = procs.log("w0") + procs.log("w1")
    assert "database unreachable" in worker_logs  # the outage hit jobs in flight: retried, then spooled
    assert "spooled" in worker_logs
    spool = Path(env["FARM_HOME"]) / "spool"
    assert not list(spool.glob("*.json")), "spooled results were not replayed"


def test_two_workers_receiving_the_same_job_run_it_once(env: dict[str, str], procs: Procs,
                                                       example_onnx: Path) -> None:
    from farm.broker import Broker

    rid, job_ids = submit_jobs(example_onnx, 1)
    for _ in range(4):
        Broker().send(job_ids[0], "farm.cpu")  # redeliveries, as after a visibility timeout or a resend
    burst = [procs.worker(env, f"b{i}", "--burst", FARM_NOOP_SLEEP_S="0.5") for i in range(2)]
    for w in burst:
        assert w.wait(timeout=120) == 0, procs.logs()
    assert counts(rid) == {"succeeded": 1}
    assert_one_result_each(rid, job_ids)
    with session_scope() as s:
        assert s.get(Job, job_ids[0]).attempts == 1
    skipped = sum(procs.log(f"b{i}").count("skipping this delivery") for i in range(2))
    assert skipped == 4


def test_job_past_its_time_limit_is_stopped_and_failed(env: dict[str, str], procs: Procs,
                                                      example_onnx: Path) -> None:
    rid, job_ids = submit_jobs(example_onnx, 1, timeout_s=1.0)
    started = time.monotonic()
    procs.worker(env, "w0", FARM_NOOP_SLEEP_S="60")
    wait_for(lambda: all_final(rid, 1), 60, "the timed-out job", procs)
    assert time.monotonic() - started < 50  # far less than the 60 s the job wanted
    with session_scope() as s:
        job = s.get(Job, job_ids[0])
        assert job.status == "failed" and "time limit of 1 s exceeded" in job.error
        assert s.get(Result, job_ids[0]).details["error"] == job.error
    wait_for(lambda: _current_job("w0") is None, 10, "the worker to be free again", procs)


def _current_job(worker_id: str) -> str | None:
    with session_scope() as s:
        w = s.get(Worker, worker_id)
        return None if w is None else w.current_job_id


def test_sigterm_hands_the_running_job_back(env: dict[str, str], procs: Procs, example_onnx: Path) -> None:
    rid, job_ids = submit_jobs(example_onnx, 1)
    w = procs.worker(env, "leaving", FARM_NOOP_SLEEP_S="60")
    wait_for(lambda: running_on("leaving"), 60, "the job to run", procs)
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0, procs.log("leaving")
    with session_scope() as s:
        job = s.get(Job, job_ids[0])
        assert (job.status, job.worker_id, job.attempts) == ("queued", None, 0)
        assert "handed back" in job.error
        assert s.get(Worker, "leaving").status == "offline"
    procs.worker(env, "next", FARM_NOOP_SLEEP_S="0")
    wait_for(lambda: all_final(rid, 1), 60, "the handed-back job", procs)
    with session_scope() as s:
        job = s.get(Job, job_ids[0])
        assert (job.status, job.worker_id, job.attempts) == ("succeeded", "next", 1)
    assert_one_result_each(rid, job_ids)


def _servers_of(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if "workers.engines.server" in " ".join(k.cmdline()):
                out.append(k)
        except psutil.Error:
            continue
    return out


def test_cancel_stops_a_running_server_and_cancels_queued_jobs(env: dict[str, str], procs: Procs,
                                                               example_onnx: Path) -> None:
    real = {k: v for k, v in env.items() if k != "FARM_NOOP_JOBS"}
    sub = submit(ProfileRequest(model=str(example_onnx), batch_sizes=[1, 2, 3],
                                measurement={"duration_s": 120, "warmup_s": 0.1}))
    rid = sub.request_id
    w = procs.worker(real, "real")
    wait_for(lambda: running_on("real") and bool(_servers_of(w.pid)), 120, "a model server to run", procs,
             poll=0.2)
    out = json.loads(farm("cancel", rid, "--json", "--wait", "30", env=real).stdout)
    assert out["queued_cancelled"] == 2 and out["running_cancelled"] == 1
    assert out["still_stopping"] == 0, procs.log("real")
    wait_for(lambda: not _servers_of(w.pid), 30, "the model server to stop", procs)
    assert w.poll() is None  # the worker survives and goes on
    assert counts(rid) == {"cancelled": 3}
    assert_one_result_each(rid, [j.job_id for j in sub.expansion.jobs])
    assert "cancelled" in procs.log("real")
    status = farm("status", rid, "--json", env=real)
    assert json.loads(status.stdout)["counts"] == {"cancelled": 3}


class _Storm:
    """Interrupt signals sent to a process from outside at random moments (every 5-50 ms) until stopped: they
    arrive while it starts, between jobs, while a job cleans up and while the next one starts."""

    def __init__(self, pid: int) -> None:
        self.pid, self.sent = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="interrupt-storm", daemon=True)

    def _run(self) -> None:
        rng = random.Random(36)
        while not self._stop.wait(rng.uniform(0.005, 0.05)):
            try:
                os.kill(self.pid, INTERRUPT_SIGNAL)
            except ProcessLookupError:
                return
            self.sent += 1

    def __enter__(self) -> _Storm:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_late_interrupts_never_end_a_worker_nor_lose_a_job(env: dict[str, str], procs: Procs,
                                                           example_onnx: Path) -> None:
    """Issue 36: a worker flooded with interrupt signals from its first instant (before its job watch exists,
    between jobs, during a job's cleanup and the next job's start), one of its jobs cancelled while it runs,
    keeps running and loses no job: every other job succeeds exactly once."""
    real = {k: v for k, v in env.items() if k != "FARM_NOOP_JOBS"}
    keep = submit(ProfileRequest(model=str(example_onnx), batch_sizes=[1, 2, 3, 4], measurement=FAST))
    stop = submit(ProfileRequest(model=str(example_onnx), batch_sizes=[5, 6],
                                 measurement={"duration_s": 120, "warmup_s": 0.1}))
    w = procs.worker(real, "storm")

    def ended() -> str:
        return f"the worker ended ({w.returncode}) after {storm.sent} interrupt signals:\n{procs.log('storm')}"

    with _Storm(w.pid) as storm:
        wait_for(lambda: w.poll() is not None or (all_final(keep.request_id, 4) and running_on("storm")
                                                  and bool(_servers_of(w.pid))),
                 240, "the kept jobs to finish and a job to be cancelled to run", procs, poll=0.2)
        assert w.poll() is None, ended()
        out = json.loads(farm("cancel", stop.request_id, "--json", "--wait", "30", env=real).stdout)
        assert out["still_stopping"] == 0, procs.log("storm")
        wait_for(lambda: all_final(stop.request_id, 2), 60, "the cancelled jobs to end", procs)
        time.sleep(1)  # more signals while the worker idles between jobs
    assert w.poll() is None, ended()
    assert storm.sent > 100
    assert counts(keep.request_id) == {"succeeded": 4}, procs.logs()
    assert counts(stop.request_id) == {"cancelled": 2}, procs.logs()
    assert_one_result_each(keep.request_id, [j.job_id for j in keep.expansion.jobs])
    wait_for(lambda: not _servers_of(w.pid), 30, "the cancelled job's server to stop", procs)
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0, procs.log("storm")
    assert "Traceback" not in procs.log("storm")

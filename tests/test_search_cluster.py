"""Quick search in cluster mode, with real Redis, Postgres, ``farm scheduler`` and ``farm worker`` processes:
the next step is enqueued as each result lands, and a search survives its worker's death mid-step."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from farm.db.models import Job
from farm.db.session import session_scope
from scheduler.enqueue import submit
from scheduler.search import search_report, searches_done
from schemas import ProfileRequest
from schemas.job import FINAL
from tests.helpers import farm, farm_env, start_worker

pytestmark = pytest.mark.slow

FAST = {"max_windows": 2, "min_windows": 1, "window_s": 0.2, "warmup_s": 0.1}
SETTINGS = {"FARM_HEARTBEAT_S": "0.5", "FARM_WORKER_DEAD_AFTER_S": "3", "FARM_REQUEUE_AFTER_S": "2",
            "FARM_RECONCILE_INTERVAL_S": "0.5", "FARM_MAX_ATTEMPTS": "10", "FARM_RUNNER": "process"}
LEVELS = [1, 2, 4, 8, 16]


class Procs:
    """The test's subprocesses (and, for killed workers, their model servers), all stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[psutil.Process] = []

    def worker(self, env: dict[str, str], name: str) -> subprocess.Popen[str]:
        p = start_worker(env, "--worker-id", name, "--runner", "process", log=self.tmp / f"{name}.log")
        self.procs.append(psutil.Process(p.pid))
        return p

    def scheduler(self, env: dict[str, str]) -> None:
        with open(self.tmp / "scheduler.log", "w") as out:
            p = subprocess.Popen([sys.executable, "-m", "farm", "scheduler"], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, text=True)
        self.procs.append(psutil.Process(p.pid))

    def kill_9(self, proc: subprocess.Popen[str]) -> None:
        """SIGKILL a worker; its model server (own process group) is kept for the final cleanup."""
        self.procs += psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.tmp.glob("*.log")))

    def stop_all(self) -> None:
        for p in self.procs:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _gone, alive = psutil.wait_procs(self.procs, timeout=20)
        for p in alive:
            p.kill()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.stop_all()


@pytest.fixture
def env(cluster_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    from farm.settings import reset_settings

    for k, v in SETTINGS.items():
        monkeypatch.setenv(k, v)
    reset_settings()
    return farm_env(**cluster_env, **SETTINGS)


def wait_for(cond: Callable[[], bool], timeout: float, what: str, procs: Procs) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{procs.logs()}")


def jobs(request_id: str) -> list[tuple[str, int, str, int, str | None]]:
    """(id, concurrency, status, attempts, worker id) of the request's jobs."""
    with session_scope() as s:
        return [tuple(r) for r in s.execute(select(Job.id, Job.concurrency, Job.status, Job.attempts, Job.worker_id)
                                            .where(Job.request_id == request_id)).all()]  # type: ignore[misc]


def test_a_search_resumes_after_its_worker_is_killed_mid_step(env: dict[str, str], procs: Procs,
                                                              example_onnx: Path) -> None:
    sub = submit(ProfileRequest(model=str(example_onnx), concurrency=LEVELS,
                                measurement={**FAST, "search": "quick"}))
    rid = sub.request_id
    assert [j.concurrency for j in sub.expansion.jobs] == [1]  # only the first step is submitted
    procs.scheduler(env)
    victim = procs.worker(env, "victim")

    def second_step_running() -> bool:
        return any(c == 2 and st == "running" and w == "victim" for _, c, st, _, w in jobs(rid))

    wait_for(second_step_running, 120, "the victim to run the search's second step", procs)
    procs.kill_9(victim)
    status = json.loads(farm("status", rid, "--json", env=env).stdout)
    assert [s["measured"] for s in status["searches"]] == [[1]] and not status["searches"][0]["done"]
    procs.worker(env, "survivor")
    wait_for(lambda: searches_done(rid) and all(st in FINAL for _, _, st, _, _ in jobs(rid)), 240,
             "the search to finish", procs)
    rows = {c: (st, attempts, w) for _, c, st, attempts, w in jobs(rid)}
    assert rows[2] == ("succeeded", 2, "survivor"), procs.logs()  # the killed step ran again, once more
    assert rows[1][:2] == ("succeeded", 1)
    measured = sorted(rows)
    assert measured == LEVELS[:len(measured)] and len(measured) >= 3  # climbed in order, no step skipped
    assert all(st == "succeeded" for st, _, _ in rows.values())
    (report,) = search_report(rid)
    assert report["done"] and report["measured"] == measured and report["best"]["throughput_infer_per_s"] > 0
    human = farm("status", rid, env=env).stdout
    assert "search cpu onnxruntime b=1: stopped" in human

"""Interrupting ``farm submit`` on the embedded default with real signals, then ``farm resume``.

A real ``python -m farm submit`` process runs its jobs in-process (process runner: the model server is its
child); the test waits until a job is ``running`` in the SQLite file and its server process exists, then
sends SIGINT or SIGTERM to the farm process only.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from farm.settings import get_settings
from tests.helpers import farm, farm_env, running_job, signal_when, start_submit

ROOT = Path(__file__).resolve().parents[2]

SHORT = ["--duration", "5", "--warmup", "0.5"]  # long enough to be interrupted, short enough to resume


def _server_of(proc: subprocess.Popen[str]) -> psutil.Process | None:
    """The model server process started by ``proc`` (farm's built-in server), if any."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if "workers.engines.server" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def _interrupt_while_serving(proc: subprocess.Popen[str], err_path: Path, signum: int,
                             settle_s: float = 0.0) -> tuple[int, str, str, list[psutil.Process]]:
    """Wait for a running job and its server (then ``settle_s`` more, to reach the load), send ``signum``;
    (exit code, stderr, job id, the processes farm had started when it got the signal: the server and any
    load generator)."""
    db_path = get_settings().home / "farm.db"

    def serving() -> tuple[str, list[psutil.Process]] | None:
        job_id, server = running_job(db_path), _server_of(proc)
        if not (job_id and server):
            return None
        time.sleep(settle_s)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert server in children
        return job_id, children

    code, (job_id, children) = signal_when(proc, err_path, serving, signum)
    return code, err_path.read_text(), job_id, children


def _request_id(err: str) -> str:
    found = re.search(r"`farm resume (\S+)`", err)
    assert found, err
    return found.group(1)


def _jobs(request_id: str, env: dict[str, str]) -> dict[str, dict[str, object]]:
    rows = json.loads(farm("results", request_id, "--format", "json", env=env).stdout)
    return {r["job_id"]: r for r in rows}


def _left(processes: list[psutil.Process], grace_s: float = 5.0) -> list[str]:
    """The command lines of those of ``processes`` still alive ``grace_s`` after `farm submit` exited (zombies
    count as gone). The grace is for helpers that end on their own once their parent is gone, such as
    multiprocessing's resource tracker (it exits when its pipe closes, a moment after the process that
    started the load generator's process); a server or load process farm failed to stop is still there."""
    psutil.wait_procs(processes, timeout=grace_s)
    alive = []
    for p in processes:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(" ".join(p.cmdline()))
        except psutil.NoSuchProcess:
            continue
    return alive


def test_sigint_cancels_the_running_job_and_resume_finishes_the_request(example_onnx: Path, tmp_path: Path) -> None:
    env = farm_env()
    proc = start_submit(example_onnx, tmp_path / "stderr", "--batch-sizes", "1,2", *SHORT, env=env)
    code, err, job_id, children = _interrupt_while_serving(proc, tmp_path / "stderr", signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err
    rid = _request_id(err)
    lines = err.strip().splitlines()
    assert lines[-1] == f"error: interrupted by SIGINT; `farm resume {rid}` runs the request's 2 remaining job(s)"
    assert f"SIGINT: job {job_id[:8]} (cpu onnxruntime b=" in lines[-2] and "cancelled" in lines[-2]
    assert _left(children) == []
    jobs = _jobs(rid, env)
    assert jobs[job_id]["status"] == "cancelled"
    assert jobs[job_id]["error"].startswith("interrupted: farm submit stopped by SIGINT")
    assert [j["status"] for i, j in jobs.items() if i != job_id] == ["queued"]

    out = farm("resume", rid, env=env, timeout=300)
    assert "2 job(s) to run, 1 of them interrupted before" in out.stderr
    jobs = _jobs(rid, env)
    assert {j["status"] for j in jobs.values()} == {"succeeded"}, jobs
    assert all(j["error"] is None and j["throughput_infer_per_s"] for j in jobs.values())


def test_sigterm_stops_the_server_and_exits_143(example_onnx: Path, tmp_path: Path) -> None:
    env = farm_env()
    proc = start_submit(example_onnx, tmp_path / "stderr", "--duration", "10", "--warmup", "0.5", env=env)
    # into the measurement: the load generator is driving the server when the signal comes
    code, err, job_id, children = _interrupt_while_serving(proc, tmp_path / "stderr", signal.SIGTERM, settle_s=3)
    assert code == 143, err
    assert "Traceback" not in err
    rid = _request_id(err)
    assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM; `farm resume ")
    assert _left(children) == []
    job = _jobs(rid, env)[job_id]
    assert job["status"] == "cancelled" and job["error"].startswith("interrupted: farm submit stopped by SIGTERM")

    # `farm cancel` after the interrupt: the user does not want it; `farm resume` then runs nothing
    farm("cancel", rid, "--wait", "0", env=env)
    out = farm("resume", rid, "--json", env=env)
    assert [r["status"] for r in json.loads(out.stdout)["results"]] == ["cancelled"]
    assert _jobs(rid, env)[job_id]["error"] == "cancelled by `farm cancel`"


def test_resume_after_sigkill_runs_the_job_left_running(example_onnx: Path, tmp_path: Path) -> None:
    """SIGKILL leaves no chance to clean up: the server dies with its parent (PDEATHSIG) and `farm resume`
    takes the job back from the dead embedded worker, as `farm scheduler` does on a cluster."""
    env = farm_env(FARM_WORKER_DEAD_AFTER_S="1")
    proc = start_submit(example_onnx, tmp_path / "stderr", *SHORT, env=env)
    code, _, job_id, children = _interrupt_while_serving(proc, tmp_path / "stderr", signal.SIGKILL)
    assert code == -signal.SIGKILL
    psutil.wait_procs(children, timeout=30)
    assert _left(children) == []
    rid = json.loads(farm("status", "--json", env=env).stdout)[0]["request_id"]
    assert _jobs(rid, env)[job_id]["status"] == "running"
    time.sleep(1.5)  # its last heartbeat is now older than FARM_WORKER_DEAD_AFTER_S
    farm("resume", rid, env=env, timeout=300)
    job = _jobs(rid, env)[job_id]
    assert (job["status"], job["attempts"]) == ("succeeded", 2)


def test_resume_of_an_unknown_request_is_one_line(tmp_path: Path) -> None:
    proc = farm("resume", "no-such-request", check=False)
    assert proc.returncode == 3
    assert proc.stderr.strip() == "error: no request 'no-such-request'; `farm status` lists requests"


def test_resume_on_a_cluster_resends_the_remaining_jobs(cluster_env: dict[str, str], example_onnx: Path) -> None:
    import redis

    from farm.broker import Broker
    from scheduler.enqueue import submit
    from schemas import ProfileRequest

    sub = submit(ProfileRequest(model=str(example_onnx), batch_sizes=[1, 2]))
    redis.Redis.from_url(cluster_env["FARM_BROKER_URL"]).flushdb()  # the messages are lost
    ids = {j.job_id for j in sub.expansion.jobs}
    queues = sorted({j.queue for j in sub.expansion.jobs})
    assert Broker().queued_job_ids(queues) == set()
    out = farm("resume", sub.request_id, "--json", env=farm_env())
    assert json.loads(out.stdout) == {"request_id": sub.request_id, "resent": 2}
    assert Broker().queued_job_ids(queues) == ids


#: the check of stop_signals, run as a process of its own: Python delivers signals to the main thread only, and a
#: pytest-xdist worker runs tests in another thread, where a raised signal would reach the worker itself
_STOP_SIGNALS_CHECK = """
import signal, sys
from farm.cli.embedded import Signalled, stop_signals
signum = int(sys.argv[1])
before = signal.getsignal(signum)
caught = []
with stop_signals():
    try:
        signal.raise_signal(signum)
    except Signalled as exc:
        caught.append(exc.signum)
    signal.raise_signal(signum)  # a second one, while the cleanup runs, is ignored
print(caught == [signum], signal.getsignal(signum) is before)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stop_signals_raise_once_then_restore_the_previous_handler(signum: int) -> None:
    done = subprocess.run([sys.executable, "-c", _STOP_SIGNALS_CHECK, str(int(signum))], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]

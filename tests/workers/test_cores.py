"""Core leases between real processes: jobs on one host take turns for cores, a killed holder frees them,
the journal says who overlapped, and a job's server and load generator really run on the leased cores."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from schemas import EdgeProfile, JobSpec, MeasurementSettings, TensorSpec
from schemas.cpus import cpu_list, parse_cpu_list
from workers.cores import CoreLease, cores_for, read_journal, split

ROOT = Path(__file__).resolve().parents[2]
CORES = sorted(os.sched_getaffinity(0))

#: a lease holder in its own process: takes all of this host's cores, writes when it got them, waits for
#: the file ``go`` (or forever), writes when it lets go, then prints its placement; SIGUSR2 stops it with
#: exit code 3 (as a worker's cancel stops a job: an exception raised by a signal handler)
HOLDER = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path
    from workers.cores import CoreLease
    signal.signal(signal.SIGUSR2, lambda *a: sys.exit(3))
    d, name, allowed = Path(sys.argv[1]), sys.argv[2], [int(c) for c in sys.argv[3].split(",")]
    with CoreLease(job_id=name, want=len(allowed), directory=d, allowed=allowed) as lease:
        (d / f"{name}.acquired").write_text(str(time.monotonic_ns()))
        while not (d / f"{name}.go").exists():
            time.sleep(0.01)
        (d / f"{name}.releasing").write_text(str(time.monotonic_ns()))
    print(json.dumps(lease.placement()))
""")


def _holder(d: Path, name: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(d), name, ",".join(map(str, CORES))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(cond: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def _spec(profile: EdgeProfile | None = None) -> JobSpec:
    return JobSpec(job_id="c" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx",
                   inputs=[TensorSpec(name="input", shape=(256,))], device="cpu", engine="onnxruntime",
                   batch_size=1, concurrency=1, queue="farm.edge" if profile else "farm.cpu",
                   measurement=MeasurementSettings(), edge_profile=profile)


def test_cpu_lists_round_trip() -> None:
    assert cpu_list([3, 0, 1, 2, 6]) == "0-3,6"
    assert parse_cpu_list("0-3,6") == [0, 1, 2, 3, 6]
    assert cpu_list([]) == ""


def test_one_cpu_list_parser_for_cpusets_leases_and_threads() -> None:
    """``schemas.cpus.parse_cpu_list`` validates an edge profile's cpuset, gives its cores to the lease
    (``cores_for``) and its size to the edge run's threads (``edge_threads``)."""
    from workers.runners.common import edge_threads

    for bad in ("a", "0-", "1,,2", "3-1"):
        with pytest.raises(ValueError, match="cpuset"):
            parse_cpu_list(bad)
        with pytest.raises(ValueError, match="cpuset"):
            EdgeProfile(cpus=1, memory="256m", cpuset=bad)
    profile = EdgeProfile(cpus=4, memory="256m", cpuset="0,2-3")
    assert profile.cores == [0, 2, 3] and EdgeProfile(cpus=1, memory="256m").cores == []
    assert cores_for(_spec(profile), list(range(8))) == [0, 2, 3]
    assert edge_threads(_spec(profile)) == min(3, os.cpu_count() or 3)


def test_how_many_cores_a_job_takes_depends_on_the_job_and_host_only() -> None:
    eight = list(range(8))
    assert cores_for(_spec(), eight) == 8  # alone on the host: all of it
    assert cores_for(_spec(), eight, slots=4) == 2
    assert cores_for(_spec(), [0, 1], slots=4) == 2  # never fewer than 2 for a serving job
    assert cores_for(_spec(), eight, job_cores=3) == 3
    assert cores_for(_spec(EdgeProfile(cpus=1.5, memory="256m")), eight) == 2
    assert cores_for(_spec(EdgeProfile(cpus=1, memory="256m", cpuset="2-3")), eight) == [2, 3]
    assert cores_for(_spec(EdgeProfile(cpus=1, memory="256m", cpuset="99")), eight) == 1  # not ours: any one
    assert split([0, 1]) == ([0], [1])  # disjoint from 2 cores on: the client never runs on the server's
    assert split([3]) == ([3], [3])  # one core: nothing to split
    assert split(list(range(8))) == ([0, 1, 2, 3, 4, 5], [6, 7])


def test_two_processes_wanting_all_cores_take_turns(tmp_path: Path) -> None:
    first = _holder(tmp_path, "first")
    _wait_for(lambda: (tmp_path / "first.acquired").exists(), "the first holder's lease")
    second = _holder(tmp_path, "second")
    # the second one queues a ticket while the first holds the cores
    _wait_for(lambda: any((tmp_path / "wait").iterdir()), "the second holder's ticket")
    assert not (tmp_path / "second.acquired").exists()
    (tmp_path / "first.go").write_text("")
    (tmp_path / "second.go").write_text("")
    out1, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    released = int((tmp_path / "first.releasing").read_text())
    acquired = int((tmp_path / "second.acquired").read_text())
    assert acquired > released
    import json

    for out in (out1, out2):
        placement = json.loads(out)
        assert placement["isolated"] is True and placement["host_shared"] is False  # one after the other
        assert placement["server_cpus"] == cpu_list(split(CORES)[0])  # the whole host, the client's share apart
    assert list((tmp_path / "wait").iterdir()) == []


def test_a_killed_holder_frees_its_cores_and_its_journal_entry_is_closed(tmp_path: Path) -> None:
    victim = _holder(tmp_path, "victim")
    _wait_for(lambda: (tmp_path / "victim.acquired").exists(), "the victim's lease")
    waiter = _holder(tmp_path, "waiter")
    _wait_for(lambda: any((tmp_path / "wait").iterdir()), "the waiter's ticket")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    _wait_for(lambda: (tmp_path / "waiter.acquired").exists(), "the waiter's lease after the kill")
    (tmp_path / "waiter.go").write_text("")
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    entries = {e.job_id: e for _, e in read_journal(tmp_path)}
    assert entries["victim"].end is not None  # found dead and closed, so it overlaps no later lease
    assert entries["victim"].end <= entries["waiter"].start


def test_the_journal_says_who_overlapped_and_whether_cores_were_shared(tmp_path: Path) -> None:
    allowed = [0, 1]
    with CoreLease("a", 1, tmp_path, allowed=allowed) as a, CoreLease("b", 1, tmp_path, allowed=allowed) as b:
        assert set(a.cores) | set(b.cores) == {0, 1} and not set(a.cores) & set(b.cores)
    pa, pb = a.placement(), b.placement()
    assert pa["host_shared"] and pb["host_shared"]  # both ran at once ...
    assert pa["isolated"] and pb["isolated"]  # ... on cores of their own
    with CoreLease("c", 2, tmp_path, allowed=allowed, isolation=False) as c:
        with CoreLease("d", 2, tmp_path, allowed=allowed, isolation=False) as d:
            assert c.cores == d.cores == allowed  # no locks: both on every core
    assert c.placement()["host_shared"] and c.placement()["isolated"] is False
    assert d.placement()["host_shared"] and d.placement()["isolated"] is False
    with CoreLease("e", 2, tmp_path, allowed=allowed) as e:
        pass
    assert e.placement()["host_shared"] is False  # everything before it had ended


def test_the_server_and_the_load_generator_run_on_the_leased_cores(example_onnx: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A real server process is pinned to the lease's server cores; the measuring thread to its load
    generator cores during the measurement, and back to all cores after."""
    from farm.settings import reset_settings
    from workers.measure import Measurement, Served
    from workers.runners.process import ProcessRunner

    monkeypatch.setenv("FARM_HOST_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("FARM_JOB_CORES", "1")
    reset_settings()
    before = os.sched_getaffinity(0)
    spec = _spec()
    with Measurement(spec) as m, ProcessRunner().serve(spec, example_onnx, m.server_cpus) as target:
        assert target.pid is not None and len(m.server_cpus) == 1
        assert os.sched_getaffinity(target.pid) == m.server_cpus
        status = Path(f"/proc/{target.pid}/status").read_text()
        assert f"Cpus_allowed_list:\t{cpu_list(m.server_cpus)}" in status
        with m.watch(Served(pid=target.pid)):
            assert os.sched_getaffinity(0) == m.loadgen_cpus
    assert os.sched_getaffinity(0) == before
    placement = m.placement
    assert placement.server_cpus == cpu_list(m.server_cpus) and placement.host_shared is False
    assert placement.isolated is True and placement.slot == 0 and placement.host


def test_waiters_are_served_in_arrival_order(tmp_path: Path) -> None:
    """A job arriving while another waits queues behind it, even when it polls at the right moment."""
    first = _holder(tmp_path, "first")
    _wait_for(lambda: (tmp_path / "first.acquired").exists(), "the first holder's lease")
    second = _holder(tmp_path, "second")
    _wait_for(lambda: len(list((tmp_path / "wait").iterdir())) == 1, "the second holder's ticket")
    third = _holder(tmp_path, "third")
    _wait_for(lambda: len(list((tmp_path / "wait").iterdir())) == 2, "the third holder's ticket")
    (tmp_path / "first.go").write_text("")
    _wait_for(lambda: (tmp_path / "second.acquired").exists(), "the second holder's lease")
    assert not (tmp_path / "third.acquired").exists()
    (tmp_path / "second.go").write_text("")
    (tmp_path / "third.go").write_text("")
    for p in (first, second, third):
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert int((tmp_path / "third.acquired").read_text()) > int((tmp_path / "second.releasing").read_text())


def test_a_job_stopped_while_it_waits_leaves_the_queue(tmp_path: Path) -> None:
    first = _holder(tmp_path, "first")
    _wait_for(lambda: (tmp_path / "first.acquired").exists(), "the first holder's lease")
    second = _holder(tmp_path, "second")
    _wait_for(lambda: any((tmp_path / "wait").iterdir()), "the second holder's ticket")
    second.send_signal(signal.SIGUSR2)
    second.communicate(timeout=60)
    assert second.returncode == 3 and not (tmp_path / "second.acquired").exists()
    assert list((tmp_path / "wait").iterdir()) == []  # its place in the queue went with it
    (tmp_path / "first.go").write_text("")
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err


def test_a_job_waits_claimed_for_its_cores_and_its_time_limit_starts_when_it_runs(
        sqlite_url: str, example_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's real path (``run_job``: ledger, JobWatch, core lease) with another process holding every
    core for longer than the job's time limit: the job waits ``claimed``, runs once the cores are free, and
    its 1 s limit counts from then (the measurement itself is replaced: it only records what it saw)."""
    from farm.db.models import Job
    from farm.db.session import session_scope
    from farm.settings import reset_settings
    from scheduler.enqueue import submit
    from schemas import JobResult, ProfileRequest
    from schemas.job import JobStatus
    from workers import execute
    from workers.cancel import JobWatch
    from workers.ledger import job_status
    from workers.runners.process import ProcessRunner

    locks = tmp_path / "locks"
    monkeypatch.setenv("FARM_HOST_LOCK_DIR", str(locks))
    reset_settings()
    sub = submit(ProfileRequest(model=str(example_onnx), measurement=MeasurementSettings(timeout_s=1.0)), send=False)
    job_id = sub.expansion.jobs[0].job_id
    holder = _holder(locks, "other")
    _wait_for(lambda: (locks / "other.acquired").exists(), "the other job's lease")
    seen: list[str] = []

    def status() -> str:
        with session_scope() as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job.status

    def fake_measure(spec: JobSpec, runner: object, uuids: list[str], slots: int) -> JobResult:
        seen.append(status())
        time.sleep(0.5)  # half of the time limit
        return JobResult(job_id=spec.job_id)

    monkeypatch.setattr(execute, "measure", fake_measure)

    def release_later() -> None:  # hold the cores 2 s after the job is seen waiting: twice its time limit
        _wait_for(lambda: status() == JobStatus.claimed, "the job to wait claimed")
        seen.append("waiting: " + status())
        time.sleep(2.0)
        (locks / "other.go").write_text("")

    import threading

    t = threading.Thread(target=release_later)
    t.start()
    try:
        with JobWatch(job_status, poll_s=0.05) as watch:
            final = execute.run_job(job_id, "w1", ProcessRunner(), watch=watch)
    finally:
        (locks / "other.go").write_text("")
        t.join(timeout=30)
        holder.wait(timeout=30)
    assert seen == ["waiting: claimed", JobStatus.running]
    assert final == JobStatus.succeeded and status() == JobStatus.succeeded

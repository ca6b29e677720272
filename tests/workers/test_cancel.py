"""The job watch: time limit, cancellation and shutdown stop the job in the main thread, once."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workers.cancel import CANCELLED, SHUTDOWN, TIMEOUT, JobInterrupt, JobWatch

ROOT = Path(__file__).resolve().parents[2]


def test_time_limit_interrupts_a_blocked_job() -> None:
    with JobWatch(lambda job: "running", poll_s=0.05) as watch:
        started = time.monotonic()
        with pytest.raises(JobInterrupt) as info, watch.job("j1", timeout_s=0.3):
            time.sleep(30)
        assert info.value.reason == TIMEOUT
        assert 0.25 <= time.monotonic() - started < 10


def test_cancelled_status_interrupts_the_job_and_cleanup_runs() -> None:
    status = {"j2": "running"}
    cleaned: list[str] = []
    with JobWatch(status.get, poll_s=0.05) as watch:
        threading.Timer(0.2, lambda: status.update(j2="cancelled")).start()
        with pytest.raises(JobInterrupt) as info, watch.job("j2", timeout_s=None):
            try:
                time.sleep(30)
            finally:
                time.sleep(0.2)  # cleanup (stopping a server) is not interrupted again
                cleaned.append("server stopped")
        assert info.value.reason == CANCELLED and cleaned == ["server stopped"]
        with watch.job("j3", timeout_s=5):  # the next job runs normally
            time.sleep(0.2)


def test_shutdown_interrupts_and_a_finished_job_is_not_interrupted_later() -> None:
    with JobWatch(lambda job: "running", poll_s=0.05) as watch:
        assert not watch.interrupt(SHUTDOWN)  # no job in hand
        with watch.job("quick", timeout_s=0.2):
            pass
        time.sleep(0.4)  # past the finished job's deadline: nothing fires
        with pytest.raises(JobInterrupt) as info, watch.job("long", timeout_s=None):
            threading.Timer(0.1, lambda: watch.interrupt(SHUTDOWN)).start()
            time.sleep(30)
        assert info.value.reason == SHUTDOWN


def test_jobs_outside_the_main_thread_are_not_interrupted_but_the_reason_is_kept() -> None:
    seen: list[str | None] = []
    with JobWatch(lambda job: "cancelled", poll_s=0.05) as watch:
        def body() -> None:
            with watch.job("t1", timeout_s=None):
                time.sleep(0.4)
                seen.append(watch.reason)

        t = threading.Thread(target=body)
        t.start()
        t.join()
    assert seen == [CANCELLED]


#: a watch that has exited, then a SIGUSR2 on its way (an interrupt sent as the job ended): the process lives on
LATE_SIGNAL = """
import os, signal, time
from workers.cancel import INTERRUPT_SIGNAL, JobWatch
with JobWatch(lambda job: "running", poll_s=0.05):
    pass
assert signal.getsignal(INTERRUPT_SIGNAL) is signal.SIG_IGN
os.kill(os.getpid(), INTERRUPT_SIGNAL)
time.sleep(0.1)
mine = lambda *a: None
signal.signal(INTERRUPT_SIGNAL, mine)
with JobWatch(lambda job: "running", poll_s=0.05):
    pass
assert signal.getsignal(INTERRUPT_SIGNAL) is mine  # a handler of the process's own is given back
print("alive")
"""


def test_a_late_interrupt_signal_after_the_watch_exits_never_ends_the_process() -> None:
    proc = subprocess.run([sys.executable, "-c", LATE_SIGNAL], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", (proc.returncode, proc.stderr[-2000:])


def test_no_signal_is_sent_once_the_watch_has_stopped() -> None:
    watch = JobWatch(lambda job: "running", poll_s=0.05)
    with watch, watch.job("j", timeout_s=None):
        watch._stop.set()  # as __exit__ does first, under the lock
        assert watch.interrupt(SHUTDOWN) is False  # nothing sent: the handler may be gone by the time it lands
        assert watch.reason == SHUTDOWN  # the reason is kept, as for a job outside the main thread

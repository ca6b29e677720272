"""The job watch: time limit, cancellation and shutdown stop the job in the main thread, once."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workers.cancel import CANCELLED, INTERRUPT_SIGNAL, SHUTDOWN, TIMEOUT, JobInterrupt, JobWatch

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


#: a watch that has exited, then an interrupt signal on its way (an interrupt sent as the job ended), and one sent
#: before any watch: the process lives on, and each watch gives back exactly the handler it found
LATE_SIGNAL = """
import os, signal, time
from workers.cancel import INTERRUPT_SIGNAL, JobWatch
assert signal.getsignal(INTERRUPT_SIGNAL) is signal.SIG_DFL
os.kill(os.getpid(), INTERRUPT_SIGNAL)  # no watch yet: the default action ignores it
with JobWatch(lambda job: "running", poll_s=0.05):
    pass
assert signal.getsignal(INTERRUPT_SIGNAL) is signal.SIG_DFL
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


def test_the_interrupt_signal_is_one_whose_default_action_ignores_it() -> None:
    """The root cause of issue 36: a signal whose default action ends the process (SIGUSR2) killed a test process
    when it arrived while no watch's handler was installed. The interrupt signal's default action must be ignore."""
    assert INTERRUPT_SIGNAL in (signal.SIGURG, signal.SIGWINCH, signal.SIGCHLD)
    proc = subprocess.run([sys.executable, "-c", f"import os, time; os.kill(os.getpid(), {int(INTERRUPT_SIGNAL)}); "
                           "time.sleep(0.1); print('alive')"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive"


def test_no_signal_is_sent_once_the_watch_has_stopped() -> None:
    watch = JobWatch(lambda job: "running", poll_s=0.05)
    with watch, watch.job("j", timeout_s=None):
        watch._stop.set()  # as __exit__ does first, under the lock
        assert watch.interrupt(SHUTDOWN) is False  # nothing sent: the handler may be gone by the time it lands
        assert watch.reason == SHUTDOWN  # the reason is kept, as for a job outside the main thread


class _Server:
    """A resource with a cleanup that takes a while (stopping a server): an interrupt must never cut it short."""

    entered = exited = 0

    def __enter__(self) -> _Server:
        _Server.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.01)  # the interrupt is sent again and again meanwhile; it must not land here
        _Server.exited += 1


def test_an_interrupt_never_lands_in_a_cleanup_and_is_deferred_to_the_body() -> None:
    with JobWatch(lambda job: "running", poll_s=0.05) as watch:
        with pytest.raises(JobInterrupt), watch.job("j", timeout_s=None):
            with _Server():
                threading.Timer(0.005, lambda: watch.interrupt(CANCELLED)).start()
            # the interrupt was asked for during the cleanup above: it lands here, in the body, after it
            time.sleep(30)
    assert _Server.entered == _Server.exited


def test_an_interrupt_asked_for_during_the_last_cleanup_dies_with_its_job() -> None:
    class StopsDuringCleanup(_Server):
        def __exit__(self, *exc: object) -> None:
            watch.interrupt(CANCELLED)  # the signal reaches this thread at once, inside this cleanup
            super().__exit__(*exc)

    with JobWatch(lambda job: "running", poll_s=0.05) as watch:
        with watch.job("j", timeout_s=None), StopsDuringCleanup():
            pass
        assert watch.reason is None  # the job ended: its stop went with it
        time.sleep(0.2)  # nothing is sent again once the job is over
        with watch.job("next", timeout_s=None):
            time.sleep(0.1)  # the next job runs undisturbed
    assert _Server.entered == _Server.exited

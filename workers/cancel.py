"""Stopping a running job: cancellation (``farm cancel``), the per-job time limit and worker shutdown.

A ``JobWatch`` is one thread per worker. While a job runs it checks the job's status in the database
every ``cancel_poll_s`` and its deadline (``MeasurementSettings.timeout_s``). When the job must stop, it
raises ``JobInterrupt`` in the thread running the job (the main thread), so the job's context managers unwind:
the model server or container is stopped as on any failure.

How the interrupt reaches the main thread, and why it cannot harm the process:

- The watch sends ``INTERRUPT_SIGNAL`` (SIGURG) to the main thread, whose handler raises ``JobInterrupt``; a
  signal wakes the thread from a blocking wait (a sleep, a pipe read) where a flag could not. SIGURG's default
  action is to ignore it: a signal that arrives while no handler is installed (before the first watch, after the
  last, or sent from outside) does nothing. SIGUSR2, used before, ends the process by default: one sent by a
  watch as another watch put the default action back ended the test process (issue 36).
- The handler raises only for the job it was sent for (a per-job generation number), at most once, and never
  inside a context manager's ``__exit__``: an interrupt that lands while the job cleans up (stopping its server,
  giving back its cores) is deferred, and the watch sends it again until it lands in the job's body or the job
  ends. So an interrupt never cuts a cleanup short and never outlives its job.
- The watch restores the previous handler exactly on exit: nothing is left behind.
- The handler is delivered on the thread's own stack, not on its alternate signal stack (``workers.signal_stack``):
  OpenVINO's CPU plugin leaves a thread an unmapped alternate stack when it is freed out of order, and a signal
  delivered there is a SIGSEGV. That, not the signal's default action, is what killed test processes in issue 36.

Jobs run outside the main thread (tests, embedded helpers) cannot be interrupted; their cancellation is
still recorded and their result refused by the ledger.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from schemas.job import JobStatus
from workers import signal_stack

log = logging.getLogger("farm.worker")

#: a signal whose default action is to ignore it (see the module docstring)
INTERRUPT_SIGNAL = signal.SIGURG
CANCELLED, TIMEOUT, SHUTDOWN = "cancelled", "timeout", "shutdown"
#: how often an interrupt that could not land yet (the job was cleaning up) is sent again, s
RESEND_S = 0.02
#: frames in which an interrupt never lands: a context manager's exit is cleanup
_CLEANUP_FRAMES = frozenset({"__exit__", "__aexit__"})


class JobInterrupt(BaseException):
    """Raised inside a running job to stop it; ``reason`` is cancelled | timeout | shutdown.

    A BaseException, so library code catching ``Exception`` does not swallow it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def in_cleanup(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a caller of it runs a context manager's exit."""
    while frame is not None:
        if frame.f_code.co_name in _CLEANUP_FRAMES:
            return True
        frame = frame.f_back
    return False


class JobWatch:
    """Watches the job in hand; ``job()`` wraps its run. ``status_of(job_id)`` reads the job's status
    (None when the database is unreachable)."""

    def __init__(self, status_of: Callable[[str], str | None], poll_s: float = 1.0) -> None:
        self.status_of = status_of
        self.poll_s = poll_s
        # reentrant: the signal handler takes it in the main thread, which may hold it already when the
        # handler runs (between two bytecodes of job() or start_clock())
        self._lock = threading.RLock()
        self._job: str | None = None
        self._gen = 0  # increases with every job(): an interrupt belongs to one of them
        self._deadline: float | None = None
        self._reason: str | None = None
        self._fired = False
        self._target: int | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._installed = False
        self._previous: Any = None  # whatever signal.signal returned: a handler, SIG_DFL/SIG_IGN or None

    # -- life cycle ---------------------------------------------------------------------------------
    def __enter__(self) -> JobWatch:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal_stack.install(INTERRUPT_SIGNAL, self._on_signal)
            self._installed = True
        self._thread = threading.Thread(target=self._loop, name="farm-job-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # no signal is sent from here on
            self._stop.set()
            uninstall, self._installed = self._installed, False
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)  # it waits on events, or on one status check at most
        if uninstall:
            # the default action of INTERRUPT_SIGNAL ignores it: a signal still on its way does nothing
            signal_stack.restore(INTERRUPT_SIGNAL, self._previous)

    # -- the job in hand ----------------------------------------------------------------------------
    @contextmanager
    def job(self, job_id: str, timeout_s: float | None) -> Iterator[None]:
        """Watch ``job_id`` while the body runs; the body may raise JobInterrupt."""
        interruptible = self._installed and threading.current_thread() is threading.main_thread()
        try:
            with self._lock:
                self._gen += 1
                self._job = job_id
                self._deadline = time.monotonic() + timeout_s if timeout_s else None
                self._reason = None
                self._fired = False
                self._target = threading.get_ident() if interruptible else None
            self._wake.set()
            yield  # a body that completes wins over a stop asked for meanwhile (its pending signal is ignored)
        finally:
            with self._lock:
                self._job = None
                self._deadline = None
                self._target = None

    def start_clock(self, timeout_s: float | None) -> None:
        """Start the job's time limit now: ``timeout_s`` from this moment (None: no limit). The worker calls
        it when the job starts running, after it waited for its cores."""
        with self._lock:
            if self._job is not None:
                self._deadline = time.monotonic() + timeout_s if timeout_s else None
        self._wake.set()

    @property
    def reason(self) -> str | None:
        """Why the current job is being stopped (None while it may go on, and between jobs)."""
        with self._lock:
            return self._reason if self._job is not None else None

    def interrupt(self, reason: str) -> bool:
        """Stop the job in hand for ``reason``; False when there is none or it cannot be interrupted."""
        with self._lock:
            if self._job is None or self._reason is not None:
                return False
            self._reason = reason
            job, sent = self._job, self._send()
        log.warning("stopping job %s: %s", job, reason)
        self._wake.set()  # the loop sends it again while it has not landed
        return sent

    def _send(self) -> bool:
        """Signal the job's thread (under the lock): only while the handler is installed and the watch runs."""
        if self._target is None or not self._installed or self._stop.is_set():
            return False
        signal.pthread_kill(self._target, INTERRUPT_SIGNAL)
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        with self._lock:
            if self._job is None or self._reason is None or self._fired:
                return
            if threading.get_ident() != self._target or in_cleanup(frame):
                return  # not the job's thread, or it is cleaning up: the watch sends it again
            self._fired = True
            reason = self._reason
        raise JobInterrupt(reason)

    # -- the watch thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                job, gen, deadline, pending = self._job, self._gen, self._deadline, self._pending()
            if job is None:
                self._wake.wait(self.poll_s)
                self._wake.clear()
            elif pending:
                self._resend(gen)
            else:
                self._check(job, gen, deadline)

    def _pending(self) -> bool:
        """An interrupt asked for that has not landed yet (under the lock)."""
        return self._reason is not None and not self._fired and self._target is not None

    def _resend(self, gen: int) -> None:
        if self._stop.wait(RESEND_S):
            return
        with self._lock:
            if self._gen == gen and self._job is not None and self._pending():
                self._send()

    def _check(self, job: str, gen: int, deadline: float | None) -> None:
        """Wait one poll (or until the deadline), then stop the job if it is past its time or cancelled."""
        # wait first: most jobs end before their first check (no query per short job)
        wait = self.poll_s if deadline is None else max(0.01, min(self.poll_s, deadline - time.monotonic()))
        self._wake.clear()
        if self._wake.wait(wait) or self._stop.is_set():
            return  # woken: the job, its clock or the watch changed; read them again
        with self._lock:
            if self._gen != gen or self._reason is not None:
                return
            deadline = self._deadline  # start_clock may have moved it meanwhile
        if deadline is not None and time.monotonic() >= deadline:
            self._interrupt_if(gen, TIMEOUT)
            return
        try:
            status = self.status_of(job)
        except Exception as exc:  # the database may blink; check again next time
            log.debug("cancel check failed: %s", exc)
            status = None
        if status == JobStatus.cancelled:
            self._interrupt_if(gen, CANCELLED)

    def _interrupt_if(self, gen: int, reason: str) -> None:
        """Interrupt the job of generation ``gen`` if it is still the one in hand."""
        with self._lock:
            if self._gen == gen:
                self.interrupt(reason)

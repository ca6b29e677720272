"""Stopping a running job: cancellation (``farm cancel``), the per-job time limit and worker shutdown.

A ``JobWatch`` is one thread per worker. While a job runs it checks the job's status in the database
every ``cancel_poll_s`` and its deadline (``MeasurementSettings.timeout_s``). When the job must stop, it
raises ``JobInterrupt`` in the thread running the job (the main thread, via a SIGUSR2 the watch sends to
it), so the job's context managers unwind: the model server or container is stopped as on any failure.
The interrupt is raised at most once per job, so it never lands inside that cleanup. The signal is sent only
while the watch's handler is installed (under the watch's lock), and a watch that exits never leaves SIGUSR2
at its default action (which ends the process): a late one is ignored, never fatal to the worker.

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

log = logging.getLogger("farm.worker")

INTERRUPT_SIGNAL = signal.SIGUSR2
CANCELLED, TIMEOUT, SHUTDOWN = "cancelled", "timeout", "shutdown"


class JobInterrupt(BaseException):
    """Raised inside a running job to stop it; ``reason`` is cancelled | timeout | shutdown.

    A BaseException, so library code catching ``Exception`` does not swallow it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
            self._previous = signal.signal(INTERRUPT_SIGNAL, self._on_signal)
            self._installed = True
        self._thread = threading.Thread(target=self._loop, name="farm-job-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # no interrupt() sends the signal from here on
            self._stop.set()
            uninstall, self._installed = self._installed, False
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if uninstall and threading.current_thread() is threading.main_thread():
            # SIG_DFL would end the process on a SIGUSR2 still on its way: ignore it instead
            keep = self._previous not in (None, signal.SIG_DFL)
            signal.signal(INTERRUPT_SIGNAL, self._previous if keep else signal.SIG_IGN)

    # -- the job in hand ----------------------------------------------------------------------------
    @contextmanager
    def job(self, job_id: str, timeout_s: float | None) -> Iterator[None]:
        """Watch ``job_id`` while the body runs; the body may raise JobInterrupt."""
        interruptible = self._installed and threading.current_thread() is threading.main_thread()
        with self._lock:
            self._job = job_id
            self._deadline = time.monotonic() + timeout_s if timeout_s else None
            self._reason = None
            self._fired = False
            self._target = threading.get_ident() if interruptible else None
        self._wake.set()
        try:
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
        """Why the current job is being stopped (None while it may go on)."""
        return self._reason

    def interrupt(self, reason: str) -> bool:
        """Stop the job in hand for ``reason``; False when there is none or it cannot be interrupted."""
        with self._lock:
            if self._job is None or self._reason is not None:
                return False
            self._reason = reason
            job, target = self._job, self._target
            # sent under the lock: the handler is still installed and the job still in hand when it arrives
            if target is not None and self._installed and not self._stop.is_set():
                signal.pthread_kill(target, INTERRUPT_SIGNAL)
            else:
                target = None
        log.warning("stopping job %s: %s", job, reason)
        return target is not None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        with self._lock:
            if self._job is None or self._reason is None or self._fired:
                return
            if threading.get_ident() != self._target:
                return
            self._fired = True
            reason = self._reason
        raise JobInterrupt(reason)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                job, deadline = self._job, self._deadline
            if job is None:
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            # wait first: most jobs end before their first check (no query per short job)
            wait = self.poll_s if deadline is None else max(0.01, min(self.poll_s, deadline - time.monotonic()))
            if self._stop.wait(wait):
                return
            with self._lock:
                if self._job != job or self._reason is not None:
                    continue
                deadline = self._deadline  # start_clock may have moved it meanwhile
            if deadline is not None and time.monotonic() >= deadline:
                self.interrupt(TIMEOUT)
                continue
            try:
                status = self.status_of(job)
            except Exception as exc:  # the database may blink; check again next time
                log.debug("cancel check failed: %s", exc)
                status = None
            if status == JobStatus.cancelled:
                with self._lock:
                    current = self._job == job
                if current:
                    self.interrupt(CANCELLED)

"""Per-digest readers-writer file locks for the worker's model cache (``farm.store.cache``).

A job *pins* a cached model with a shared lock for as long as it uses it; publishing, re-verifying and evicting
take the exclusive lock, so eviction never removes a model a running job uses, and one process downloads while
the others wait.

Why ``fcntl.flock`` and not ``fcntl.lockf`` (tests/pg_lock.py's choice) or the ``filelock`` library:
``filelock`` has no shared mode, and POSIX record locks (``lockf``) belong to the *process*: a second open of the
same lock file in one process (two pins of one model in one process, a thread, ``farm submit``'s embedded run)
would silently convert the first lock, and closing either descriptor would drop both. ``flock`` locks belong to
the open file description: two opens conflict like two processes, closing one never drops another, and a killed
process never leaves one held. Their one cost, inheritance by a child forked *without* exec, does not arise here:
Python opens every descriptor close-on-exec, ``subprocess`` closes them in the child, and the worker forks no
bare children; a child that did would at worst keep a pin (delay eviction) until it exits.

A lock file is removed when its entry is evicted; a process that opened it just before then holds a lock on an
unlinked inode, so every acquisition checks that the path still names the inode it locked, and reopens if not.
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from farm.errors import ArtifactError

POLL_S = 0.05  # how often a blocked acquisition retries (s)


class DigestLock:
    """One open of a lock file; ``shared()``, ``exclusive()``, ``try_exclusive()``, ``release()``; a context
    manager that releases and closes it."""

    def __init__(self, path: Path, wait_s: float) -> None:
        self.path = path
        self.wait_s = wait_s  # how long a blocked acquisition waits before an ArtifactError (s)
        self._fd: int | None = None

    def __enter__(self) -> DigestLock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock and close the file."""
        if self._fd is not None:
            os.close(self._fd)  # closing the description releases its flock
            self._fd = None

    def release(self) -> None:
        """Drop whatever lock is held, keeping the file open."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def shared(self) -> None:
        """Wait for a shared lock (a pin): many holders, none while an exclusive one is held."""
        self._take(fcntl.LOCK_SH, "a shared")

    def exclusive(self) -> None:
        """Wait for the exclusive lock (publish, verify, evict): released first if a shared one is held, since
        ``flock`` converts non-atomically anyway and two upgrading holders must not deadlock."""
        self.release()
        self._take(fcntl.LOCK_EX, "the exclusive")

    def try_exclusive(self) -> bool:
        """The exclusive lock if nobody holds any lock on the file now (an unpinned entry); never waits."""
        return self._attempt(fcntl.LOCK_EX)

    def unlink(self) -> None:
        """Remove the lock file (under the exclusive lock: its entry is gone); later opens make a new one."""
        self.path.unlink(missing_ok=True)

    def _take(self, mode: int, what: str) -> None:
        deadline = time.monotonic() + self.wait_s
        while not self._attempt(mode):
            if time.monotonic() > deadline:
                raise ArtifactError(
                    f"waited {self.wait_s:.0f} s for {what} lock on {self.path} (another job fetches or uses this "
                    "model); retry the job, or look for a hung process holding the file (fuser -v PATH)")
            time.sleep(POLL_S)

    def _attempt(self, mode: int) -> bool:
        """One non-blocking acquisition on the file the path names now (reopened if it was replaced)."""
        while True:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(self._fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            try:
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    return True
            except FileNotFoundError:
                pass
            self.close()  # locked an unlinked file (its entry was evicted meanwhile): lock the new one

"""One PostgreSQL for every test process (pytest-xdist), and one test that stops it: a cross-process
readers-writer lock on files, so that the outage never lands in another process's test.

Each test that uses Postgres (``pg_url`` among its fixtures) holds the lock shared from its setup to its
teardown (module fixtures built in its setup included); a test marked ``stops_postgres`` holds it exclusive.
A gate file keeps the writer from starving: it takes the gate first, and readers pass the gate (shared) only
to take their own lock, so once a writer waits no new reader starts.

The locks are POSIX record locks (``fcntl.lockf``), not ``flock``: they belong to the process, so a child it
forks never inherits one (a forked child that hangs would otherwise hold the lock for ever), and a killed
process never leaves one held. The files are named after the pytest-xdist run (``PYTEST_XDIST_TESTRUNUID``),
so a process left over from another run cannot block this one, and a wait has a deadline: a test that cannot
get the lock fails with a message instead of hanging the run.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

#: how long a test waits for the lock before it fails (s): longer than the longest test that holds it
WAIT_S = float(os.environ.get("FARM_TEST_PG_LOCK_WAIT_S", "900"))
POLL_S = 0.05


def lock_dir() -> Path:
    """This run's directory of lock files: one per pytest-xdist run (one per process when run serially)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"serial-{os.getpid()}"
    path = Path(tempfile.gettempdir()) / f"farm-tests-postgres-{run}"
    path.mkdir(exist_ok=True)
    return path


def _take(f: IO[str], mode: int, what: str, deadline: float) -> None:
    """Take a lock on ``f`` (``fcntl.LOCK_SH`` or ``LOCK_EX``), polling until ``deadline`` (monotonic s)."""
    while True:
        try:
            fcntl.lockf(f, mode | fcntl.LOCK_NB)
            return
        except OSError:  # EAGAIN or EACCES: another process holds it
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"waited {WAIT_S:.0f} s for the test suite's Postgres lock ({what}, {f.name}); a test that holds "
                    "it has hung: see the other test process's output (FARM_TEST_PG_LOCK_WAIT_S sets the wait)"
                ) from None
            time.sleep(POLL_S)


@contextmanager
def postgres_in_use(exclusive: bool, directory: Path | None = None) -> Iterator[None]:
    """Hold the Postgres lock for a test: shared (it uses Postgres) or exclusive (it stops Postgres).

    ``directory`` holds the lock files (default: this run's, ``lock_dir()``)."""
    where = directory or lock_dir()
    deadline = time.monotonic() + WAIT_S
    # lockf's shared lock needs the file open for reading, its exclusive lock for writing: "a+" is both
    with open(where / "gate", "a+") as gate, open(where / "main", "a+") as main:
        if exclusive:
            _take(gate, fcntl.LOCK_EX, "the gate, as the test that stops Postgres", deadline)
            _take(main, fcntl.LOCK_EX, "exclusive, for the test that stops Postgres", deadline)
        else:
            _take(gate, fcntl.LOCK_SH, "the gate, while a test that stops Postgres runs", deadline)
            _take(main, fcntl.LOCK_SH, "shared, for a test that uses Postgres", deadline)
            fcntl.lockf(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.lockf(main, fcntl.LOCK_UN)
            fcntl.lockf(gate, fcntl.LOCK_UN)

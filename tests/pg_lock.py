"""One PostgreSQL for every test process (pytest-xdist), and one test that stops it: a cross-process
readers-writer lock on files, so that the outage never lands in another process's test.

Each test that uses Postgres (``pg_url`` among its fixtures) holds the lock shared from its setup to its
teardown (module fixtures built in its setup included); a test marked ``stops_postgres`` holds it exclusive.
A gate file keeps the writer from starving: it takes the gate first, and readers pass the gate (shared) only
to take their own lock, so once a writer waits no new reader starts. ``fcntl.flock`` locks go with the process,
so a killed test process never leaves one held.
"""
from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_DIR = Path(tempfile.gettempdir())
GATE, MAIN = LOCK_DIR / "farm-tests-postgres.gate", LOCK_DIR / "farm-tests-postgres.lock"


@contextmanager
def postgres_in_use(exclusive: bool) -> Iterator[None]:
    """Hold the Postgres lock for a test: shared (it uses Postgres) or exclusive (it stops Postgres)."""
    with open(GATE, "a+") as gate, open(MAIN, "a+") as main:
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(main, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(main, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)

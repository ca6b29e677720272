"""The test suite's Postgres lock (tests/pg_lock.py): a test that stops Postgres waits for the tests using it
and keeps new ones out until it is done, across processes (as pytest-xdist runs them); a child forked by a
holder never keeps it, and a wait that cannot end fails instead of hanging the run.

Each test uses its own lock directory, never the run's, so it cannot block the suite around it; its processes
are spawned, not forked from the (threaded) pytest-xdist worker."""
from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import pytest

from tests import pg_lock
from tests.pg_lock import postgres_in_use

ROOT = Path(__file__).resolve().parents[1]


def _hold(exclusive: bool, seconds: float, events: Queue[Any], name: str, directory: Path) -> None:
    with postgres_in_use(exclusive, directory):
        events.put(f"{name} in")
        time.sleep(seconds)
        events.put(f"{name} out")


def _wait_for_the_gate_closed(directory: Path) -> None:
    deadline = time.monotonic() + 30
    with open(directory / "gate", "a+") as gate:
        while time.monotonic() < deadline:
            try:
                fcntl.lockf(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return
            fcntl.lockf(gate, fcntl.LOCK_UN)
            time.sleep(0.01)
    raise AssertionError("the writer never took the gate")


def test_the_outage_waits_for_users_and_keeps_new_ones_out(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    events: Queue[Any] = ctx.Queue()
    reader = ctx.Process(target=_hold, args=(False, 1.0, events, "reader", tmp_path))
    reader.start()
    assert events.get(timeout=60) == "reader in"
    writer = ctx.Process(target=_hold, args=(True, 0.5, events, "writer", tmp_path))
    writer.start()
    _wait_for_the_gate_closed(tmp_path)  # the writer holds the gate and waits for the reader
    late = ctx.Process(target=_hold, args=(False, 0.0, events, "late", tmp_path))
    late.start()
    for p in (reader, writer, late):
        p.join(timeout=60)
        assert p.exitcode == 0
    order = [events.get(timeout=5) for _ in range(5)]
    assert order == ["reader out", "writer in", "writer out", "late in", "late out"], order


#: takes the lock exclusive, forks a child that outlives it (as a hung server or worker forked by a test
#: would), prints the child's pid and dies holding the lock (as a crashed pytest-xdist worker does), leaving
#: the lock to the child if the child inherited it
FORK_AND_LEAVE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from tests.pg_lock import postgres_in_use
    with postgres_in_use(True, Path(sys.argv[1])):
        pid = os.fork()
        if pid == 0:
            os.close(1), os.close(2)  # the caller reads our output to its end
            time.sleep(120)
            os._exit(0)
        print(pid, flush=True)
        os._exit(0)
""")


def test_a_child_forked_by_a_holder_does_not_keep_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = subprocess.run([sys.executable, "-c", FORK_AND_LEAVE, str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    child = int(out.split()[0])
    try:
        assert Path(f"/proc/{child}").exists()  # it lives on, its parent gone
        monkeypatch.setattr(pg_lock, "WAIT_S", 5.0)
        with postgres_in_use(True, tmp_path):  # would wait for the child if it held the lock
            pass
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_wait_that_cannot_end_fails_with_a_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = mp.get_context("spawn")
    events: Queue[Any] = ctx.Queue()
    holder = ctx.Process(target=_hold, args=(True, 30.0, events, "holder", tmp_path))
    holder.start()
    try:
        assert events.get(timeout=60) == "holder in"
        monkeypatch.setattr(pg_lock, "WAIT_S", 0.5)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="Postgres lock .*FARM_TEST_PG_LOCK_WAIT_S"), \
                postgres_in_use(False, tmp_path):
            pass
        assert time.monotonic() - started < 20  # it gave up; it did not wait for the holder's 30 s
    finally:
        holder.kill()
        holder.join(timeout=30)

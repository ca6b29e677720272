"""The test suite's Postgres lock (tests/pg_lock.py): a test that stops Postgres waits for the tests using it
and keeps new ones out until it is done, across processes (as pytest-xdist runs them)."""
from __future__ import annotations

import fcntl
import multiprocessing as mp
import time
from multiprocessing.queues import Queue
from typing import Any

from tests.pg_lock import GATE, postgres_in_use


def _hold(exclusive: bool, seconds: float, events: Queue[Any], name: str) -> None:
    with postgres_in_use(exclusive):
        events.put(f"{name} in")
        time.sleep(seconds)
        events.put(f"{name} out")


def _wait_for_the_gate_closed() -> None:
    deadline = time.monotonic() + 30
    with open(GATE, "a+") as gate:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            fcntl.flock(gate, fcntl.LOCK_UN)
            time.sleep(0.01)
    raise AssertionError("the writer never took the gate")


def test_the_outage_waits_for_users_and_keeps_new_ones_out() -> None:
    ctx = mp.get_context("fork")
    events: Queue[Any] = ctx.Queue()
    reader = ctx.Process(target=_hold, args=(False, 1.0, events, "reader"))
    reader.start()
    assert events.get(timeout=30) == "reader in"
    writer = ctx.Process(target=_hold, args=(True, 0.5, events, "writer"))
    writer.start()
    _wait_for_the_gate_closed()  # the writer holds the gate and waits for the reader
    late = ctx.Process(target=_hold, args=(False, 0.0, events, "late"))
    late.start()
    for p in (reader, writer, late):
        p.join(timeout=60)
        assert p.exitcode == 0
    order = [events.get(timeout=5) for _ in range(5)]
    assert order == ["reader out", "writer in", "writer out", "late in", "late out"], order

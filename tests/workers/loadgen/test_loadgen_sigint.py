"""Ctrl-C prints one line (issue 27, point 7): SIGINT reaches the terminal's whole process group, load
processes included; they ignore it (each used to die with a KeyboardInterrupt traceback) and end when the
parent stops them."""
from __future__ import annotations

import os
import signal
import time

from workers.loadgen.drivers import ProcessDriver
from workers.loadgen.kserve.messages import Ready
from workers.loadgen.kserve.worker import WorkerConfig
from workers.loadgen.patterns import ClosedLoop
from workers.loadgen.plan import WindowPlan


def test_load_processes_ignore_sigint_and_end_cleanly_when_stopped() -> None:
    cfg = WorkerConfig(url="127.0.0.1:1", model_name="model", request=b"", pattern=ClosedLoop(1),
                       plan=WindowPlan(0.1, (0.1,), 1, False), connect_timeout_s=5.0, check_ready=False)
    with ProcessDriver([cfg, cfg]) as driver:
        ready: set[int] = set()
        deadline = time.monotonic() + 30
        while len(ready) < 2 and time.monotonic() < deadline:
            ready |= {i for i, m in driver.recv(0.5) if isinstance(m, Ready)}
        assert ready == {0, 1}
        for proc in driver._procs:
            os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        assert [p.is_alive() for p in driver._procs] == [True, True]  # not killed by a KeyboardInterrupt
        procs = list(driver._procs)
    assert [p.exitcode for p in procs] == [0, 0]  # Stop ended them, not SIGTERM or an exception

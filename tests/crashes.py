"""A test process that ends under pytest-xdist says how it ended.

pytest-xdist reports a lost test process as "node down: Not properly terminated" and no more: a signal, an exit
code and a closed channel look the same. This plugin (loaded by tests/conftest.py, active in the controlling
process) waits for the lost process and prints its exit status, the signal's name, and the kernel's last OOM
lines when the kernel killed it, so that a crash names its cause in the run's output (issue 36).
"""
from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: how long a lost test process may take to be reaped, s
REAP_S = 10.0
#: how many lines of a crashed process's fault dump are printed
FAULT_LINES = 200


def phase_file(controller_pid: int, worker: str) -> Path:
    """Where test process ``worker`` notes the phase it is in (the controller reads it when the process is lost)."""
    return Path(tempfile.gettempdir()) / f"farm-test-phase-{controller_pid}-{worker}"


def fault_file(controller_pid: int, worker: str) -> Path:
    """Where test process ``worker``'s faulthandler writes (a pytest-xdist worker's own stderr is not shown)."""
    return Path(tempfile.gettempdir()) / f"farm-test-fault-{controller_pid}-{worker}"


_FAULTS: list[Any] = []  # the open fault file, kept for the process's life (faulthandler writes to its descriptor)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """In a test process under xdist: a fatal signal (SIGSEGV, SIGABRT, SIGBUS ...) dumps every thread's Python
    stack into the fault file, which the controller prints when the process is lost."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        _FAULTS.append(fault_file(os.getppid(), worker).open("w"))
        faulthandler.enable(file=_FAULTS[0], all_threads=True)


def _note(phase: str) -> None:
    """In a test process under xdist: note where it is, so that a crash's report says it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        phase_file(os.getppid(), worker).write_text(phase)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _note(f"in the setup of {item.nodeid}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _note(f"in the body of {item.nodeid}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _note(f"in the teardown of {item.nodeid}")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str) -> None:
    _note(f"between tests, after {nodeid}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        phase_file(os.getppid(), worker).unlink(missing_ok=True)
        if _FAULTS:
            faulthandler.disable()
            _FAULTS.pop().close()
            fault_file(os.getppid(), worker).unlink(missing_ok=True)


def exit_status(popen: Any) -> str:
    """How a test process ended: ``exit code N``, ``killed by SIGNAME`` or ``still running``."""
    try:
        code = popen.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:
        return "still running (its channel closed; a test closed or corrupted the channel's file descriptor)"
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def kernel_oom_lines(limit: int = 5) -> list[str]:
    """The kernel log's last lines about OOM kills (empty where the log cannot be read)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.splitlines() if "oom" in line.lower() or "Killed process" in line][-limit:]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's hook in the controlling process: a test process went down (``error`` set when it crashed)."""
    if error is None:
        return
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return
    status = exit_status(popen)
    lines = [f"[{node.gateway.id}] test process {popen.pid}: {status}"]
    phase = phase_file(os.getpid(), node.gateway.id)
    if phase.exists():
        lines.append(f"  it was {phase.read_text()}")
        phase.unlink(missing_ok=True)
    fault = fault_file(os.getpid(), node.gateway.id)
    if fault.exists():
        lines += [f"  {line}" for line in fault.read_text(errors="replace").splitlines()[-FAULT_LINES:]]
        fault.unlink(missing_ok=True)
    if "SIGKILL" in status:
        lines += [f"  kernel: {line}" for line in kernel_oom_lines()]
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:  # the terminal's writer: the controller's sys.stderr is captured while tests run
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line, file=sys.__stderr__)

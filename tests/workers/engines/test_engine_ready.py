"""wait_ready against a real server, a closed port, a wrong model name and a dead process."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from farm.errors import ServerError
from workers.engines.ready import wait_ready


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ready_against_real_server(mlp_server) -> None:
    wait_ready(mlp_server.url, "model", timeout_s=30)


def test_timeout_on_closed_port_says_what_to_check() -> None:
    t0 = time.monotonic()
    with pytest.raises(ServerError) as ei:
        wait_ready(f"127.0.0.1:{_closed_port()}", "model", timeout_s=0.5)
    assert time.monotonic() - t0 < 30  # generous: it gives up near the timeout, it does not hang
    msg = str(ei.value)
    assert "not ready" in msg and "model" in msg and "check" in msg


def test_wrong_model_name_times_out(mlp_server) -> None:
    with pytest.raises(ServerError, match="ModelReady"):
        wait_ready(mlp_server.url, "other", timeout_s=0.5)


def test_dead_process_stops_waiting_at_once() -> None:
    with pytest.raises(ServerError, match="exited before it was ready"):
        wait_ready(f"127.0.0.1:{_closed_port()}", "model", timeout_s=600, alive=lambda: False)


def test_ready_while_server_starts(mlp_onnx: Path, start_server) -> None:
    with start_server(mlp_onnx) as s:
        wait_ready(s.url, "model", timeout_s=30, alive=lambda: s.proc.poll() is None)
        assert s.proc.poll() is None


@pytest.mark.slow
def test_ready_when_server_comes_up_late(mlp_onnx: Path, repo_root: Path) -> None:
    """wait_ready keeps reconnecting quickly while nothing listens yet, then sees the late server."""
    import signal
    import subprocess
    import sys
    import threading

    port = _closed_port()
    outcome: list[object] = []

    def waiter() -> None:
        try:
            wait_ready(f"127.0.0.1:{port}", "model", timeout_s=120)
            outcome.append(time.monotonic())
        except Exception as exc:  # reported by the assertion below
            outcome.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(3.0)  # several failed connection attempts first
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.engines.server", str(mlp_onnx), "--port", str(port)],
        cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        line = proc.stdout.readline().decode() if proc.stdout else ""
        assert line.strip() == f"farm-serve listening 127.0.0.1:{port}"
        up = time.monotonic()
        t.join(timeout=120)
        assert outcome and isinstance(outcome[0], float), outcome
        assert outcome[0] - up < 30  # generous: seen within the short reconnect backoff, not minutes
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        for s in (proc.stdout, proc.stderr):
            if s is not None:
                s.close()

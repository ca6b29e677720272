"""The process runner always stops the server and frees its port, also when measurement fails."""
from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from farm.errors import ServerError
from schemas import JobSpec, MeasurementSettings, TensorSpec
from workers.runners.process import ProcessRunner


def _spec(model: Path) -> JobSpec:
    return JobSpec(job_id="j" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx",
                   inputs=[TensorSpec(name="input", shape=(256,))], device="cpu", engine="onnxruntime",
                   batch_size=1, concurrency=1, queue="farm.cpu", measurement=MeasurementSettings())


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_server_is_stopped_and_port_freed_when_the_body_fails(example_onnx: Path) -> None:
    runner = ProcessRunner()
    seen: dict[str, int] = {}
    with pytest.raises(RuntimeError, match="measurement blew up"):
        with runner.serve(_spec(example_onnx), example_onnx) as target:
            seen.update(pid=target.pid or 0, port=target.port)
            assert psutil.pid_exists(target.pid)
            assert not _port_free(target.port)
            raise RuntimeError("measurement blew up")
    proc_gone = not psutil.pid_exists(seen["pid"]) or psutil.Process(seen["pid"]).status() == psutil.STATUS_ZOMBIE
    assert proc_gone
    assert _port_free(seen["port"])


def test_a_server_that_cannot_load_its_model_fails_with_its_own_words(tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ServerError) as info:
        with ProcessRunner().serve(_spec(bad), bad):
            pass
    assert "\n" not in str(info.value)
    assert "model server" in str(info.value)


def test_the_server_dies_with_its_worker_even_on_kill_9(example_onnx: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tests.workers.test_process_runner import _spec\n"
        "from workers.runners.process import ProcessRunner\n"
        f"m = Path({str(example_onnx)!r})\n"
        "with ProcessRunner().serve(_spec(m), m) as t:\n"
        "    print(t.pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    server_pid = int(worker.stdout.readline())
    assert psutil.pid_exists(server_pid)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and psutil.pid_exists(server_pid):
        try:
            if psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    alive = psutil.pid_exists(server_pid) and psutil.Process(server_pid).status() != psutil.STATUS_ZOMBIE
    assert not alive, "the model server outlived its killed worker"

"""Fixtures for the engine tests: tiny ONNX models built with onnx.helper, and a real server subprocess."""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 60.0


def _save(model: object, path: Path) -> Path:
    import onnx

    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def build_identity(path: Path) -> Path:
    """x: FP32 [N, 4] -> y = x; ids: INT64 [N, 3] -> ids_out = ids (two inputs, two dtypes)."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["ids"], ["ids_out"])],
        "identity",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["N", 3]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return _save(m, path)


def build_mlp(path: Path, in_dim: int = 16, hidden: int = 32, out_dim: int = 4, seed: int = 0) -> Path:
    """x: FP32 [N, in_dim] -> Gemm -> Relu -> Gemm -> y: FP32 [N, out_dim]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    init = [
        numpy_helper.from_array(rng.standard_normal((in_dim, hidden)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal((hidden,)).astype(np.float32), "B1"),
        numpy_helper.from_array(rng.standard_normal((hidden, out_dim)).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal((out_dim,)).astype(np.float32), "B2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "W1", "B1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "W2", "B2"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", in_dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", out_dim])],
        init,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return _save(m, path)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-models")


@pytest.fixture(scope="session")
def identity_onnx(model_dir: Path) -> Path:
    return build_identity(model_dir / "identity.onnx")


@pytest.fixture(scope="session")
def mlp_onnx(model_dir: Path) -> Path:
    return build_mlp(model_dir / "mlp.onnx")


@dataclass
class ServerProc:
    """A running ``python -m workers.engines.server`` subprocess."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)


def server_cmd(model: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "workers.engines.server", str(model), "--port", "0", *args]


def read_port_line(proc: subprocess.Popen[bytes], timeout_s: float = START_TIMEOUT_S) -> tuple[str, int]:
    """Read stdout until the ``farm-serve listening HOST:PORT`` line; fail with stderr if the process dies."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=0.2):
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                line = buf.split(b"\n", 1)[0].decode()
                assert line.startswith("farm-serve listening "), line
                hostport = line.rsplit(" ", 1)[1]
                host, port = hostport.rsplit(":", 1)
                return host, int(port)
    finally:
        sel.close()
    proc.kill()
    err = proc.stderr.read().decode() if proc.stderr else ""
    raise AssertionError(f"server printed no port line (rc={proc.poll()}): {buf!r} {err}")


@contextmanager
def running_server(model: Path, *args: str) -> Iterator[ServerProc]:
    """Start the server subprocess, yield it once its port line is read, always stop it."""
    with running_command(server_cmd(model, *args)) as server:
        yield server


@contextmanager
def running_command(cmd: list[str]) -> Iterator[ServerProc]:
    """Start ``cmd`` (a server printing its port line) from the repository root, yield it once that line is
    read, always stop it (SIGTERM, then SIGKILL after 30 s) and close its pipes."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    try:
        host, port = read_port_line(proc)
        yield ServerProc(proc, host, port)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def mlp_server(mlp_onnx: Path) -> Iterator[ServerProc]:
    with running_server(mlp_onnx, "--threads", "1") as s:
        yield s


@pytest.fixture(scope="module")
def identity_server(identity_onnx: Path) -> Iterator[ServerProc]:
    with running_server(identity_onnx, "--instances", "2", "--threads", "1", "--model-name", "ident") as s:
        yield s


@pytest.fixture(scope="session")
def start_server():
    """``start_server(model, *args)``: context manager running the server subprocess (see running_server)."""
    return running_server


@pytest.fixture(scope="session")
def serve_cmd():
    """``serve_cmd(model, *args)``: the server command line with ``--port 0``."""
    return server_cmd


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT

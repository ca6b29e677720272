"""Fixtures for the load generator tests: subprocess model servers (a scripted fake and farm's own)."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
START_TIMEOUT_S = 60.0


@contextmanager
def serve_subprocess(cmd: list[str], prefix: str, timeout_s: float = START_TIMEOUT_S) -> Iterator[str]:
    """Start ``cmd``, wait for a stdout line ``<prefix> HOST:PORT``, yield ``HOST:PORT``; always stop it."""
    from workers.runners.process import ServerProcess

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with ServerProcess(cmd, env=env, listen_prefix=prefix + " ") as server:
        server.wait_port(timeout_s)
        assert server.address is not None
        yield server.address


@pytest.fixture
def fake_server() -> Callable[..., object]:
    """``with fake_server("--params", "--compute-ms", "1") as url:`` a scripted KServe v2 test server."""

    def start(*args: str) -> object:
        return serve_subprocess([sys.executable, str(HERE / "fake_server.py"), *args], "fake-serve listening")

    return start


def identity_onnx(path: Path, shape: tuple[int, ...] = (16,)) -> Path:
    """Write an ONNX Identity model with input ``x`` (FP32, batch dim + ``shape``) and output ``y``."""
    import onnx
    from onnx import TensorProto, helper

    dims: list[int | str] = ["batch", *shape]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def farm_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """farm's built-in server serving an identity ONNX model named ``model``."""
    model = identity_onnx(tmp_path_factory.mktemp("model") / "identity.onnx")
    cmd = [sys.executable, "-m", "workers.engines.server", str(model), "--format", "onnx", "--engine",
           "onnxruntime", "--host", "127.0.0.1", "--port", "0", "--threads", "1", "--instances", "1",
           "--model-name", "model"]
    with serve_subprocess(cmd, "farm-serve listening") as url:
        yield url

"""Serving containers have no way out (issue 27 point 4): on farm's internal network a TCP connect from inside
the container to a listener outside that network fails, while a container on the default bridge reaches the
same listener and the load client still reaches the server. Only docker-internal addresses are used."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.docker

LISTEN = ("import socket\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('0.0.0.0', 9999)); s.listen(8)\n"
          "while True:\n"
          "    c, _ = s.accept(); c.sendall(b'outside'); c.close()\n")


def _connect(ip: str) -> str:
    """A Python one-liner that prints 'reached' or 'blocked' for a TCP connect to ``ip``:9999 (3 s)."""
    return ("import socket\n"
            f"try:\n    socket.create_connection(('{ip}', 9999), timeout=3).recv(16); print('reached')\n"
            "except OSError as exc:\n    print('blocked', exc)\n")


@pytest.fixture
def outside(docker_client: Any, runtime_image: str) -> Iterator[str]:
    """A listener on Docker's default bridge, the 'outside' a job must not reach; its address."""
    c = docker_client.containers.run(runtime_image, ["python", "-c", LISTEN], entrypoint=[""], detach=True,
                                     user="65534:65534", labels={"farm.test": "egress"})
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            c.reload()
            ip = c.attrs["NetworkSettings"]["Networks"].get("bridge", {}).get("IPAddress")
            if ip:
                break
            time.sleep(0.1)
        assert ip, "the listener got no address on the default bridge"
        time.sleep(1.0)  # the listener binds
        yield ip
    finally:
        c.remove(force=True)


def test_serving_container_cannot_reach_outside_but_is_reached(
        runner: Any, docker_client: Any, runtime_image: str, models: dict[str, Path], make_spec: Any,
        outside: str) -> None:
    import tritonclient.grpc as grpcclient

    # control: the same connect from a container on the default bridge gets through
    control = docker_client.containers.run(runtime_image, ["python", "-c", _connect(outside)], entrypoint=[""],
                                           user="65534:65534", remove=True).decode()
    assert control.strip() == "reached", control
    with runner.serve(make_spec(models["mlp"]), models["mlp"]) as target:
        c = docker_client.containers.get(target.container_id)
        code, out = c.exec_run(["python", "-c", _connect(outside)])
        assert out.decode().startswith("blocked"), out.decode()
        # the load client (here: a gRPC client on the host) still reaches the server at its address
        client = grpcclient.InferenceServerClient(url=target.url)
        x = np.ones((2, 256), dtype=np.float32)
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        assert client.infer(target.model_name, [inp]).as_numpy("output").shape[0] == 2
        client.close()

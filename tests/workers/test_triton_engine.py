"""The triton engine: attach to a running KServe v2 / Triton server, or start the official image."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.errors import ContainerError
from tests.helpers import FAST, farm, farm_env
from tests.workers.test_process_runner import _spec
from workers.runners.process import ProcessRunner


@pytest.mark.slow
def test_triton_jobs_attach_to_a_running_server(example_onnx: Path, tmp_path: Path) -> None:
    # farm's own server speaks the same KServe v2 protocol: it stands in for a running Triton here
    with ProcessRunner().serve(_spec(example_onnx), example_onnx) as server:
        env = farm_env(FARM_TRITON_URL=server.url, FARM_RUNNER="process")
        out = farm("submit", str(example_onnx), "--engine", "triton", "--json", *FAST, env=env)
    rows = json.loads(out.stdout)["results"]
    assert [r["engine"] for r in rows] == ["triton"]
    assert rows[0]["status"] == "succeeded" and rows[0]["throughput_infer_per_s"] > 0


def test_triton_without_docker_or_url_fails_with_what_to_do(example_onnx: Path) -> None:
    spec = _spec(example_onnx).model_copy(update={"engine": "triton"})
    with pytest.raises(Exception) as info:
        with ProcessRunner().serve(spec, example_onnx):
            pass
    assert "FARM_TRITON_URL" in str(info.value)


@pytest.mark.docker
def test_docker_runner_refuses_a_missing_triton_image(example_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docker = pytest.importorskip("docker")
    try:
        docker.from_env(timeout=5).ping()
    except Exception:
        pytest.skip("no Docker daemon answers")
    from farm.settings import reset_settings
    from workers.runners.docker import DockerRunner

    monkeypatch.setenv("FARM_TRITON_IMAGE", "farm-test/no-such-triton:0")
    reset_settings()
    spec = _spec(example_onnx).model_copy(update={"engine": "triton"})
    with DockerRunner(worker_id="triton-test") as runner:
        with pytest.raises(ContainerError, match="farm never pulls"):
            with runner.serve(spec, example_onnx):
                pass

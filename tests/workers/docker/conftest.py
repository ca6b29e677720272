"""Docker fixtures: a daemon (the tests skip only when none answers), the locally built runtime image,
example models, job specs, and a session-end check that no farm container is left behind."""
from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas import EdgeProfile, JobSpec, MeasurementSettings, TensorSpec
from tests.leaks import farm_containers

REPO = Path(__file__).resolve().parents[3]
SESSION = uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A Docker client; skips the test only when no daemon answers."""
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker daemon answers: {exc}")
    before = farm_containers(client)
    yield client
    # session-end check: every farm container this test process created is gone (each test is checked too:
    # tests/leaks.py names the one that left it)
    left = farm_containers(client) - before
    assert not left, f"farm containers left after the docker tests: {sorted(c[:12] for c in left)}"


@pytest.fixture(scope="session")
def runtime_image(docker_client: Any) -> str:
    """The runtime image built from this checkout (instant when already built)."""
    from workers.images import DEFAULT_TAG, build_local_image

    build_local_image(DEFAULT_TAG, REPO, client=docker_client)
    return DEFAULT_TAG


@pytest.fixture
def worker_id() -> str:
    """A worker id no other test (or developer) uses, so orphan cleanup touches only ours."""
    return f"pytest-{SESSION}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Example ONNX models (farm.models.examples), world-readable for the containers' nobody user."""
    from farm.models.examples import build_example

    d = tmp_path_factory.mktemp("docker-models")
    d.chmod(0o755)
    out = {
        "mlp": build_example("mlp", d / "mlp.onnx"),
        "compute": build_example("compute", d / "compute.onnx", ms=4.0),
        "memory": build_example("memory", d / "memory.onnx", mb=384.0),
    }
    for p in out.values():
        p.chmod(0o644)
    return out


@pytest.fixture
def make_spec() -> Callable[..., JobSpec]:
    """``make_spec(model_path, job_id=..., edge=EdgeProfile|None, batch_size=, threads=, ...)``."""

    def make(model: Path, job_id: str | None = None, edge: EdgeProfile | None = None, batch_size: int = 1,
             inputs: list[TensorSpec] | None = None, **measurement: Any) -> JobSpec:
        return JobSpec(
            job_id=job_id or f"job-{uuid.uuid4().hex[:8]}",
            request_id=f"req-{SESSION}",
            model_sha256=hashlib.sha256(model.read_bytes()).hexdigest(),
            model_format="onnx",
            model_filename=model.name,
            inputs=inputs or [],
            device="cpu",
            engine="onnxruntime",
            batch_size=batch_size,
            concurrency=1,
            edge_profile=edge,
            queue="cpu",
            measurement=MeasurementSettings(**measurement),
        )

    return make


@pytest.fixture
def make_runner(docker_client: Any, runtime_image: str, worker_id: str) -> Iterator[Callable[..., Any]]:
    """``make_runner(**kwargs)``: a DockerRunner on the session's image and this test's worker id;
    every runner made is closed and its containers removed after the test."""
    from workers.runners.docker import DockerRunner

    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        opts: dict[str, Any] = dict(worker_id=worker_id, image=runtime_image, build_image=False,
                                    docker_client=docker_client, ready_timeout_s=60)
        opts.update(kwargs)
        r = DockerRunner(**opts)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
        r.cleanup_orphans()


@pytest.fixture
def runner(make_runner: Callable[..., Any]) -> Any:
    """A DockerRunner with default settings (reuse on)."""
    return make_runner()

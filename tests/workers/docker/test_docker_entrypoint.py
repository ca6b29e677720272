"""An image with docker/Dockerfile's ``ENTRYPOINT ["farm"]`` still runs farm's engine commands: the Docker
runner resets the entrypoint for its own ``python -m workers...`` commands (serving and the edge bench)."""
from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas.specs import EdgeProfile

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def entrypoint_image(docker_client: Any, runtime_image: str) -> Iterator[str]:
    """The runtime image plus an ENTRYPOINT that cannot run farm's engine commands (built without a pull)."""
    tag = "farm-runtime:entrypoint-test"
    dockerfile = f'FROM {runtime_image}\nENTRYPOINT ["farm"]\n'.encode()
    docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, pull=False, rm=True)
    assert docker_client.images.get(tag).attrs["Config"]["Entrypoint"] == ["farm"]
    yield tag
    docker_client.images.remove(tag, force=True)


def test_serving_and_edge_containers_ignore_the_images_entrypoint(
        make_runner: Any, entrypoint_image: str, models: dict[str, Path], make_spec: Any, docker_client: Any) -> None:
    runner = make_runner(image=entrypoint_image, reuse=False)
    with runner.serve(make_spec(models["mlp"]), models["mlp"]) as target:
        c = docker_client.containers.get(target.container_id)
        assert c.attrs["Config"]["Entrypoint"] in (None, [])
        assert c.attrs["Config"]["Cmd"][:3] == ["python", "-m", "workers.engines.server"]
    spec = make_spec(models["mlp"], edge=EdgeProfile(cpus=1, memory="1g"), warmup_s=0.1, duration_s=0.5)
    result = runner.run_edge(spec, models["mlp"])
    assert result.metrics["throughput_infer_per_s"] > 0 and result.metrics["oom_killed"] is False

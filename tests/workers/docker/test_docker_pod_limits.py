"""An edge pool's pod (here: a container with the same limits) holds the process runner's edge runs to the
profile: ``Limits.enforced_around`` recognises the worker's own cgroup when it carries exactly the profile."""
from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.docker

PROBE = ("import json; from workers.limits import Limits; "
         "print(json.dumps([Limits(cpus=1.5, memory_bytes=1 << 30).enforced_around(), "
         "Limits(cpus=1, memory_bytes=1 << 30).enforced_around(), "
         "Limits(cpus=1.5, memory_bytes=512 << 20).enforced_around()]))")


@pytest.mark.parametrize("cpus, memory, expected", [(1.5, 1 << 30, [True, False, False]),
                                                    (None, None, [False, False, False])])
def test_a_container_sized_to_the_profile_enforces_it(docker_client: Any, runtime_image: str, cpus: float | None,
                                                       memory: int | None, expected: list[bool]) -> None:
    limits: dict[str, Any] = {}
    if cpus is not None:
        limits = {"nano_cpus": int(cpus * 1e9), "mem_limit": memory, "memswap_limit": memory}
    container = docker_client.containers.run(runtime_image, ["python", "-c", PROBE], detach=True, user="65534:65534",
                                             read_only=True, network_mode="none", labels={"farm.test": "pod-limits"},
                                             **limits)
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0, container.logs().decode()[-2000:]
        notes = json.loads(container.logs(stderr=False).decode().strip().splitlines()[-1])
    finally:
        container.remove(force=True)
    assert [n is not None for n in notes] == expected
    if expected[0]:
        assert "worker's own cgroup" in notes[0]

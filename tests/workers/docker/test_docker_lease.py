"""A serving container on a 1-core lease: ``--cpuset-cpus`` holds it, and farm's one thread check
(``workers.serving.confine``, in ``Runner.serve``) reads every thread of the container's processes (host pids
from its cgroup's ``cgroup.procs``) and finds them all on the leased core."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from workers.serving.confine import check_threads, server_pids

pytestmark = pytest.mark.docker


def test_every_thread_of_a_serving_container_is_on_its_leased_core(runner: Any, docker_client: Any,
                                                                  models: dict[str, Path], make_spec: Any) -> None:
    one = {min(os.sched_getaffinity(0))}
    with runner.serve(make_spec(models["mlp"]), models["mlp"], one) as target:
        assert docker_client.containers.get(target.container_id).attrs["HostConfig"]["CpusetCpus"] == str(min(one))
        pids, why = server_pids(target)
        if why is not None:  # a worker in another pid namespace cannot see the container's processes
            assert any("not checked" in n for n in target.notes)
            pytest.skip(why)
        threads = check_threads(target, one)
        assert len(threads) >= 2 and all(t.cpus == frozenset(one) for t in threads), [t.describe() for t in threads]
        assert not any("not checked" in n for n in target.notes)

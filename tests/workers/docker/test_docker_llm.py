"""The llama.cpp engine in a container: farm's image variant ``<tag>-llm`` carries llama-cpp-python's server,
the server answers a streamed chat completion inside a 1-core cpuset, and its container is removed after."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from tests.llm_servers import skip_without
from tests.workers.serving.test_llm_engines import spec_for, stream_chat

pytestmark = [pytest.mark.docker, pytest.mark.llm, pytest.mark.slow]


def test_llama_cpp_serves_a_stream_in_a_container(make_runner: Callable[..., Any], tiny_llama: Any,
                                                   docker_client: Any) -> None:
    skip_without("llama.cpp")
    runner = make_runner(build_image=True)
    core = min(os.sched_getaffinity(0))
    with runner.serve(spec_for("llama.cpp"), tiny_llama.gguf, cpus={core}) as target:
        container_id = target.container_id
        assert container_id
        deltas, last = stream_chat(f"http://{target.url}/v1")
        assert len(deltas) >= 2 and last["choices"][0]["finish_reason"] == "length"
    runner.close()
    assert container_id not in {c.id for c in docker_client.containers.list(all=True)}


def test_transformers_serves_a_stream_in_a_container(make_runner: Callable[..., Any], tiny_llama: Any,
                                                      docker_client: Any) -> None:
    skip_without("transformers")
    runner = make_runner(build_image=True, ready_timeout_s=300)
    core = min(os.sched_getaffinity(0))
    with runner.serve(spec_for("transformers"), tiny_llama.hf, cpus={core}) as target:
        container_id = target.container_id
        deltas, last = stream_chat(f"http://{target.url}/v1")
        assert len(deltas) >= 2 and last["choices"][0]["finish_reason"] == "length"
    runner.close()
    assert container_id not in {c.id for c in docker_client.containers.list(all=True)}

"""Container sampling (``workers.measure.choose``): the cgroup sampler is picked when the cgroup is found;
the Docker stats API fallback (``workers.samplers.docker_stats``) still yields CPU and memory figures."""
from __future__ import annotations

from typing import Any

import pytest

from schemas import EdgeProfile, JobSpec, MeasurementSettings, TensorSpec

pytestmark = pytest.mark.docker

BUSY = "import time\nend = time.time() + 4\nx = bytearray(64 << 20)\nwhile time.time() < end: pass\n"


EDGE_SPEC = JobSpec(job_id="s" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx", batch_size=1,
                    concurrency=1, inputs=[TensorSpec(name="input", shape=(4,))], device="cpu", engine="onnxruntime",
                    edge_profile=EdgeProfile(cpus=0.5, memory=256 << 20), queue="farm.edge",
                    measurement=MeasurementSettings())


def _busy_container(client: Any, image: str, worker_id: str) -> Any:
    from workers.runners import hardening as hd

    return client.containers.run(image, ["python", "-c", BUSY], detach=True, network_mode="none",
                                 labels=hd.labels(worker_id, "sampling", "edge"), nano_cpus=500_000_000,
                                 **hd.hardening())


def test_cgroup_sampler_is_used_for_a_found_cgroup(docker_client: Any, runtime_image: str, worker_id: str) -> None:
    from workers.measure import Served, choose, stored
    from workers.runners import hardening as hd

    c = _busy_container(docker_client, runtime_image, worker_id)
    try:
        cg = hd.cgroup_path(c.id)
        assert cg is not None and c.id in str(cg)
        (sampler,), notes = choose(EDGE_SPEC, Served(cgroup=cg, container=c))
        assert notes == [] and sampler.name == "cgroup"
        with sampler:
            c.wait(timeout=60)
        s = sampler.summary()
        assert 10 < s["cpu_pct_avg"] <= 55  # quota 0.5 core
        assert s["mem_peak_bytes"] >= 64 << 20
        d = stored(sampler)
        assert d["rate_hz"] >= 10 and d["series"]
    finally:
        hd.remove(c, stop_timeout_s=1)


def test_docker_stats_fallback_reports_cpu_and_memory(docker_client: Any, runtime_image: str,
                                                      worker_id: str) -> None:
    from workers.measure import Served, choose
    from workers.runners import hardening as hd
    from workers.samplers.docker_stats import DockerStatsSampler

    c = _busy_container(docker_client, runtime_image, worker_id)
    try:
        (sampler,), notes = choose(EDGE_SPEC, Served(container=c))
        assert isinstance(sampler, DockerStatsSampler) and "Docker stats API" in notes[0]
        with sampler:
            c.wait(timeout=60)
        s = sampler.summary()
        assert len(sampler.samples) >= 2
        assert 10 < s["cpu_pct_avg"] <= 60
        assert s["mem_peak_bytes"] >= 64 << 20
        assert set(sampler.details()) == {"block_read_bytes", "block_write_bytes", "net_rx_bytes", "net_tx_bytes"}
    finally:
        hd.remove(c, stop_timeout_s=1)

"""Limits: what an edge profile limits, as Docker settings, as result metrics and as a real cgroup
(``LimitedCgroup``; skipped only when this machine cannot create limited cgroups)."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from schemas import EdgeProfile, JobSpec, MeasurementSettings, TensorSpec
from workers.limits import LimitedCgroup, Limits

MIB = 1 << 20
PY = sys.executable


def _spec(edge: EdgeProfile | None) -> JobSpec:
    return JobSpec(job_id="l" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx", batch_size=1,
                   concurrency=1, inputs=[TensorSpec(name="input", shape=(4,))], device="cpu", engine="onnxruntime",
                   edge_profile=edge, queue="farm.edge" if edge else "farm.cpu",
                   measurement=MeasurementSettings())


def test_an_edge_job_is_limited_like_its_profile_and_a_serving_job_is_not() -> None:
    limits = Limits.of(_spec(EdgeProfile(cpus=0.5, memory=256 * MIB, cpuset="0-1")))
    assert limits == Limits(cpus=0.5, memory_bytes=256 * MIB, cpuset="0-1")
    assert Limits.of(_spec(None)) is None


def test_docker_settings_forbid_swap_and_pin_only_with_a_cpuset() -> None:
    assert Limits(cpus=1.5, memory_bytes=64 * MIB).docker_kwargs() == {
        "nano_cpus": 1_500_000_000, "mem_limit": 64 * MIB, "memswap_limit": 64 * MIB}
    assert Limits(cpus=1, memory_bytes=64 * MIB, cpuset="0").docker_kwargs()["cpuset_cpus"] == "0"


def test_metrics_match_the_cgroups_and_use_registry_names() -> None:
    from schemas.metrics import BY_NAME

    limits = Limits(cpus=0.5, memory_bytes=64 * MIB)
    lc = limits.cgroup(name="never-entered")
    assert (lc.cpus, lc.memory_bytes, lc.cpuset_cpus, lc.name) == (0.5, 64 * MIB, None, "never-entered")
    assert limits.metrics(True) == {**lc.metrics(), "limits_enforced": True}
    assert set(limits.metrics(False)) <= set(BY_NAME)


class _Container:
    def __init__(self, nano_cpus: int, memory: int) -> None:
        self.attrs: dict[str, Any] = {"HostConfig": {"NanoCpus": nano_cpus, "Memory": memory}}


def test_a_container_check_trusts_docker_only_when_the_cgroup_is_unreadable() -> None:
    limits = Limits(cpus=0.5, memory_bytes=64 * MIB)
    ok, notes = limits.check_container(_Container(500_000_000, 64 * MIB), None)
    assert ok and notes == ["limits could not be read back from the container's cgroup; trusting Docker's HostConfig"]
    ok, notes = limits.check_container(_Container(1_000_000_000, 64 * MIB), None)
    assert not ok and "Docker did not record the limits" in notes[0]


def test_cpuset_pins_and_a_bad_one_is_reported_not_raised(limited: type[LimitedCgroup]) -> None:
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    with limited(cpuset_cpus="0") as lc:
        if not lc.enforced:
            pytest.skip(f"cpuset not available here: {lc.reason}")
        out = subprocess.run(lc.command([PY, "-c", code]), capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[0]"
    with limited(cpuset_cpus="4095") as bad:
        assert bad.created and not bad.enforced
        assert "cpuset" in bad.reason
        assert bad.metrics()["limits_enforced"] is False

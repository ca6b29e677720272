"""A served job's op-profiling pass under the Docker runner (issue 26 point 6): taken in a container of the job's
image, on the serving container's cpuset, with the ONNX graph mapping (fused nodes) that farm's image now carries."""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.docker


def test_a_served_jobs_pass_runs_in_a_container_on_the_jobs_cpuset(runner: Any, models: dict[str, Path],
                                                                 make_spec: Any, docker_client: Any) -> None:
    core = sorted(os.sched_getaffinity(0))[-1]
    spec = make_spec(models["mlp"], batch_size=2, op_profile=True)
    with runner.serve(spec, models["mlp"], {core}) as target:  # the job's server, then stopped: as measure() runs it
        served_in = target.container_id
    prof, trace = runner.profile_pass(spec, models["mlp"], {core})
    assert prof.status == "ok" and prof.batch_size == 2, prof
    where = re.fullmatch(r"container (\w+) of (\S+), cpuset (\S+): host (\w+), pid (\d+)", prof.site or "")
    assert where, prof.site
    box, image, cpuset, hostname, pid = where.groups()
    assert hostname == box and hostname != socket.gethostname()  # the pass saw the container's own hostname
    assert int(pid) < 10 and image == runner.image and box != served_in[:12]  # its own pid namespace, same image
    assert cpuset == str(core) and prof.cpus == str(core)  # every thread of the pass stayed on the job's cores
    fused = [n for n in prof.nodes if n.fused]
    assert fused and all(n.op_type == "FusedGemm" for n in fused)  # onnx inside the image: the graph mapping
    assert any(m.startswith("Relu") for n in fused for m in n.fused)
    assert trace is not None and trace[:2] == b"\x1f\x8b"  # ORT's trace, read back from the container's /out
    assert prof.peak_gflops and prof.peak_gflops > 0 and "measured" in (prof.peak_source or "")
    left = docker_client.containers.list(all=True, filters={"label": f"farm.job_id={spec.job_id}"})
    assert all(c.labels.get("farm.role") != "profile" for c in left)  # the pass's container is gone


def test_a_crashing_pass_in_its_container_keeps_a_failed_profile_with_the_signal(
        runner: Any, models: dict[str, Path], make_spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_OP_PROFILE_CRASH", "1")
    from farm.settings import reset_settings

    reset_settings()
    prof, trace = runner.profile_pass(make_spec(models["mlp"], op_profile=True), models["mlp"], None)
    assert prof.status == "failed" and "signal 6" in (prof.reason or "") and trace is None, prof

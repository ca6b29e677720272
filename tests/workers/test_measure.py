"""The one sampler choice for every job (serving or edge, process or container, with or without a GPU),
the limits a job gets, and the one way a sampler's series is stored."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from farm.errors import SamplerError
from schemas import EdgeProfile, JobSpec, MeasurementSettings, TensorSpec
from tests.workers.samplers.conftest import fake_nvml_dir, run_py  # noqa: F401  (fake NVML fixture)
from workers.limits import Limits
from workers.measure import SERIES_MAX_POINTS, STATS_API_NOTE, Measurement, Served, choose, stored, thin
from workers.samplers.base import Sampler
from workers.samplers.cgroup import CgroupSampler
from workers.samplers.docker_stats import DockerStatsSampler
from workers.samplers.foreign import ForeignLoadSampler
from workers.samplers.host import HostSampler
from workers.samplers.nvml import NvmlSampler
from workers.samplers.process import ProcessTreeSampler

EDGE = EdgeProfile(cpus=0.5, memory=256 << 20)


def _spec(edge: EdgeProfile | None = None) -> JobSpec:
    return JobSpec(job_id="m" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx", batch_size=1,
                   concurrency=1, inputs=[TensorSpec(name="input", shape=(4,))], device="cpu",
                   engine="onnxruntime", edge_profile=edge, queue="farm.edge" if edge else "farm.cpu",
                   measurement=MeasurementSettings())


def _kinds(samplers: list[Sampler]) -> list[type]:
    return [type(s) for s in samplers]


def test_a_process_serving_job_gets_its_process_tree_and_the_host() -> None:
    samplers, notes = choose(_spec(), Served(pid=os.getpid()))
    assert _kinds(samplers) == [ProcessTreeSampler, HostSampler] and notes == []


def test_a_docker_serving_job_gets_its_cgroup_with_the_peak_reset_when_reused(tmp_path: Path) -> None:
    samplers, _ = choose(_spec(), Served(cgroup=tmp_path, reused=True))
    assert _kinds(samplers) == [CgroupSampler, HostSampler]
    cg = samplers[0]
    assert isinstance(cg, CgroupSampler) and cg.reset_peak and cg.pid is None
    assert not choose(_spec(), Served(cgroup=tmp_path))[0][0].reset_peak  # type: ignore[attr-defined]


def test_a_gpu_serving_job_gets_nvml_first_watching_the_server_tree() -> None:
    gpu = NvmlSampler(["GPU-00000000-0000-0000-0000-000000000000"])  # NVML is opened only when sampling
    samplers, _ = choose(_spec(), Served(pid=os.getpid()), gpu)
    assert _kinds(samplers) == [NvmlSampler, ProcessTreeSampler, HostSampler] and samplers[0] is gpu
    assert gpu.pids is not None and os.getpid() in gpu.pids()
    assert _kinds(choose(_spec(), Served(pid=os.getpid()))[0]) == [ProcessTreeSampler, HostSampler]


def test_an_edge_job_gets_only_its_run(tmp_path: Path) -> None:
    samplers, notes = choose(_spec(EDGE), Served(pid=123, cgroup=tmp_path, container=object()))
    assert _kinds(samplers) == [CgroupSampler] and notes == []
    assert samplers[0].pid == 123  # type: ignore[attr-defined]  # its network namespace
    samplers, notes = choose(_spec(EDGE), Served(container=object()))
    assert _kinds(samplers) == [DockerStatsSampler] and notes == [STATS_API_NOTE]
    samplers, notes = choose(_spec(EDGE), Served(pid=os.getpid()))
    assert _kinds(samplers) == [ProcessTreeSampler] and notes == []


def test_limits_come_with_edge_jobs_only() -> None:
    assert Measurement(_spec(EDGE)).limits == Limits(cpus=0.5, memory_bytes=256 << 20)
    assert Measurement(_spec()).limits is None


def test_an_edge_job_never_opens_nvml() -> None:
    with Measurement(_spec(EDGE), ["GPU-00000000-0000-0000-0000-000000000000"]) as m:
        assert m.gpu is None


def _until(check: Any, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_watched_edge_run_is_stored_with_its_series() -> None:
    with Measurement(_spec(EDGE)) as m:  # entering may wait for cores and calibrates: start the run after it
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        with m.watch(Served(pid=proc.pid)):
            _until(lambda: len(m.samplers[0].samples) >= 2)  # the run lives until it has been sampled
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
    assert _kinds(m.samplers) == [ProcessTreeSampler, ForeignLoadSampler]
    assert "mem_peak_bytes" in m.metrics() and None not in m.metrics().values()
    res = m.details()["resources"]
    assert res["sampler"] == "process" and res["samples"] == len(res["series"]) >= 2 and res["rate_hz"] > 0


def test_an_edge_sampler_that_cannot_start_is_a_note_and_a_serving_one_fails() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    time.sleep(0.1)
    with Measurement(_spec(EDGE)) as m, m.watch(Served(pid=proc.pid)):
        pass
    assert m.samplers == [] and m.details()["resources"] == {} and set(m.details()) == {"resources", "calibration"}
    # Other notes may come first (a job in another test process held the cores): look among them all.
    assert any(n.startswith("no resource samples: SamplerError") for n in m.notes), m.notes
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exited, not yet reaped: nothing to sample
    _until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE)
    with Measurement(_spec(EDGE)) as m, m.watch(Served(pid=zombie.pid)):
        pass
    zombie.wait(timeout=30)
    assert "mem_peak_bytes" not in m.metrics() and m.details()["resources"]["samples"] == 0
    assert "no resource samples: the run ended before the process sampler's first sample" in m.notes, m.notes
    with pytest.raises(SamplerError), Measurement(_spec()) as m, m.watch(Served(pid=proc.pid)):
        pass


def test_serving_samplers_are_stored_one_key_each() -> None:
    with Measurement(_spec()) as m, m.watch(Served(pid=os.getpid())):
        time.sleep(0.3)
    details = m.details()
    assert set(details) == {"sampler.process", "sampler.host", "sampler.foreign", "calibration"}
    assert all({"sampler", "series", "samples", "error"} <= set(d) for k, d in details.items() if k != "calibration")


class _Fixed(Sampler):
    name = "fixed"

    def __init__(self, n: int) -> None:
        super().__init__()
        self.samples = [{"t": float(i), "v": float(i)} for i in range(n)]

    def sample(self) -> dict[str, float] | None:
        return None

    def summary(self) -> dict[str, Any]:
        return {}


def test_series_are_thinned_evenly_over_the_whole_run() -> None:
    assert len(thin([{"t": 0.0}] * 10)) == 10
    for n in (SERIES_MAX_POINTS + 1, 2 * SERIES_MAX_POINTS - 1, 7 * SERIES_MAX_POINTS + 3):
        kept = thin([{"t": float(i)} for i in range(n)])
        assert SERIES_MAX_POINTS // 2 <= len(kept) <= SERIES_MAX_POINTS and kept[0]["t"] == 0.0
        assert kept[-1]["t"] >= n - n / SERIES_MAX_POINTS - 1  # reaches the end of the run
    out = stored(_Fixed(5000))
    assert out["samples"] == 5000 and len(out["series"]) <= SERIES_MAX_POINTS and out["rate_hz"] == 1.0


GPU_JOB = """
import json, os, time
from schemas import JobSpec, MeasurementSettings, TensorSpec
from workers.measure import Measurement, Served
state = os.environ["FAKE_NVML_STATE"]
def put(mib):
    text = open(state).read().replace("mem_used 1073741824", f"mem_used {{mib << 20}}")
    open(state + ".tmp", "w").write(text); os.replace(state + ".tmp", state)
spec = JobSpec(job_id="g" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx", batch_size=1,
               concurrency=1, inputs=[TensorSpec(name="input", shape=(4,))], device="gpu:l4", engine="onnxruntime",
               queue="farm.gpu", measurement=MeasurementSettings())
with Measurement(spec, [{uuid!r}]) as m:  # the idle baseline: 1 GiB used
    put(1024 + 300)  # the server loads 300 MiB
    with m.watch(Served(pid=os.getpid())):
        time.sleep(0.4)
failed = Measurement(spec, [{uuid!r}])
try:
    with failed:
        raise RuntimeError("the server did not start")
except RuntimeError:
    pass
print(json.dumps({{"samplers": [s.name for s in m.samplers], "metrics": m.metrics(), "details": list(m.details()),
                  "open": [m.gpu._inited, failed.gpu._inited]}}))
"""


def test_a_gpu_serving_job_is_measured_against_the_idle_baseline_and_nvml_is_released(
        fake_nvml_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    uuid = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
    state = tmp_path / "nvml.state"
    state.write_text(f"driver 550.54.15\ngpu 0 uuid {uuid}\ngpu 0 name NVIDIA L4\ngpu 0 mem_total {24 << 30}\n"
                     f"gpu 0 mem_used {1 << 30}\ngpu 0 util_gpu 40\ngpu 0 power_mw 30000\n")
    out = run_py(GPU_JOB.format(uuid=uuid), fake_nvml_dir, state)
    assert out["samplers"] == ["nvml", "process", "host", "foreign"]
    assert out["metrics"]["gpu_mem_peak_bytes"] == 300 << 20  # device used minus the idle baseline
    assert out["details"] == ["sampler.nvml", "sampler.process", "sampler.host", "sampler.foreign", "calibration"]
    assert out["open"] == [False, False]  # NVML shut down after sampling, and when the server never started

"""Edge runs on the process runner: a cgroup-limited local process, OOM kills reported as such."""
from __future__ import annotations

from pathlib import Path

import pytest

from farm.models.examples import build_example
from schemas import EdgeProfile, JobSpec, MeasurementSettings, TensorSpec
from workers.limits import LimitedCgroup
from workers.runners.process import ProcessRunner


def _cgroups_work() -> bool:
    with LimitedCgroup(cpus=0.5, memory_bytes=64 << 20) as cg:
        return cg.enforced


def _spec(model: Path, shape: tuple[int, ...], profile: EdgeProfile, batch: int = 1) -> JobSpec:
    return JobSpec(job_id="e" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx",
                   inputs=[TensorSpec(name="input", shape=shape)], device="cpu", engine="onnxruntime",
                   batch_size=batch, concurrency=1, edge_profile=profile, queue="farm.edge",
                   measurement=MeasurementSettings(warmup_s=0.2, window_s=0.5, min_windows=2, max_windows=2))


@pytest.mark.slow
def test_half_a_cpu_is_enforced_and_reported(example_onnx: Path) -> None:
    if not _cgroups_work():
        pytest.skip("this host does not let farm create limited cgroups")
    result = ProcessRunner().run_edge(_spec(example_onnx, (256,), EdgeProfile(cpus=0.5, memory="256m")), example_onnx)
    m = result.metrics
    assert m["limits_enforced"] is True and m["cpu_limit"] == 0.5 and m["mem_limit_bytes"] == 256 << 20
    assert m["oom_killed"] is False
    assert m["cpu_pct_avg"] <= 60
    assert m["throughput_infer_per_s"] > 0 and m["latency_p50_ms"] > 0
    assert m["mem_peak_bytes"] > 0 and m["total_time_s"] >= 1.0


@pytest.mark.slow
def test_a_model_above_the_memory_limit_is_reported_oom_killed(tmp_path: Path) -> None:
    if not _cgroups_work():
        pytest.skip("this host does not let farm create limited cgroups")
    model = build_example("memory", tmp_path / "memory.onnx", mb=192)
    from farm.models.info import inspect_model

    shape = inspect_model(model).inputs[0].shape
    result = ProcessRunner().run_edge(_spec(model, shape, EdgeProfile(cpus=1, memory="96m", name="small")), model)
    assert result.metrics["oom_killed"] is True
    assert "killed: out of memory (limit 96 MiB)" in result.details["error"]
    assert result.metrics["mem_peak_bytes"] >= 64 << 20


@pytest.mark.slow
def test_limits_that_cannot_be_applied_are_reported_not_enforced(example_onnx: Path) -> None:
    """A cpuset naming a CPU this host lacks cannot be applied: the run still happens, and says so."""
    import os

    missing_cpu = str((os.cpu_count() or 1) + 62)
    profile = EdgeProfile(cpus=1, memory="256m", cpuset=missing_cpu, name="bad-cpuset")
    result = ProcessRunner().run_edge(_spec(example_onnx, (256,), profile), example_onnx)
    assert result.metrics["limits_enforced"] is False
    assert any("NOT enforced" in n for n in result.details["notes"])
    assert result.metrics["throughput_infer_per_s"] > 0


def test_the_edge_bench_warms_up_for_a_jobs_default_time(example_onnx: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Run without --warmup-s, the edge bench warms up as long as a job does by default (one default)."""
    import json

    from schemas.request import MEASUREMENT_DEFAULTS
    from workers.edge_bench import main

    assert main(["--model", str(example_onnx), "--duration-s", "0.05", "--inputs",
                 json.dumps([{"name": "input", "dtype": "FP32", "shape": [256]}])]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["warmup_s"] == MEASUREMENT_DEFAULTS["warmup_s"] == 0.5 and report["warmup_iterations"] >= 1

"""A real job's host figures: the yardstick before and after, and a CPU hog pinned to the server's cores flagged
"host busy" on its result row (farm results' notes too).

The quiet case is not asserted here: the test host is shared (other test runs load its cores), so a quiet run of
a real job cannot be promised a low foreign share; ``tests/workers/samplers/test_foreign_sampler.py`` judges the
flag on a figure measured from controlled counters instead."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.cli.views import host_lines
from farm.readers.results import result_rows
from farm.settings import reset_settings
from scheduler.enqueue import submit
from schemas import EdgeProfile, JobSpec, MeasurementSettings, ProfileRequest, TensorSpec
from schemas.job import JobStatus
from workers import execute
from workers.cores import split
from workers.runners.process import ProcessRunner

CORES = sorted(os.sched_getaffinity(0))
SHORT = {"warmup_s": 0.3, "window_s": 0.5, "min_windows": 3, "max_windows": 3}


@pytest.fixture
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock directory of this test's own: the lease takes every core, the server the first ones."""
    monkeypatch.setenv("FARM_HOST_LOCK_DIR", str(tmp_path / "locks"))
    reset_settings()
    return tmp_path / "locks"


def _hog(cores: list[int]) -> subprocess.Popen[bytes]:
    """A process spinning one core, pinned to ``cores``."""
    return subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {set(cores)})\nwhile True:\n"
                             "    pass\n"])


def test_a_hog_on_the_server_cores_flags_the_row_host_busy(sqlite_url: str, example_onnx: Path, locks: Path) -> None:
    server_cores = split(CORES)[0]
    sub = submit(ProfileRequest(model=str(example_onnx), measurement=MeasurementSettings(**SHORT)), send=False)
    hog = _hog(server_cores)
    try:
        assert execute.run_job(sub.expansion.jobs[0].job_id, "w1", ProcessRunner()) == JobStatus.succeeded
    finally:
        hog.kill()
        hog.wait()
    row = result_rows(sub.request_id)[0]
    print(f"hog on cores {server_cores}: foreign_cpu_pct={row['foreign_cpu_pct']} "
          f"host_speed_change_pct={row['host_speed_change_pct']} host_speed_index={row['host_speed_index']}")
    assert row["foreign_cpu_pct"] > 10.0
    assert row["host_speed_index"] > 0 and row["host_speed_change_pct"] is not None
    assert any("host busy" in line for line in host_lines([row]))


def test_an_edge_run_reports_the_host_figures(example_onnx: Path, locks: Path) -> None:
    spec = JobSpec(job_id="e" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx",
                   inputs=[TensorSpec(name="input", shape=(256,))], device="cpu", engine="onnxruntime",
                   batch_size=1, concurrency=1, edge_profile=EdgeProfile(cpus=1, memory="256m"), queue="farm.edge",
                   measurement=MeasurementSettings(warmup_s=0.2, window_s=0.5, min_windows=2, max_windows=2))
    result = ProcessRunner().run_edge(spec, example_onnx)
    m = result.metrics
    assert m["host_speed_index"] > 0 and m["host_speed_change_pct"] is not None  # type: ignore[operator]
    assert m.get("foreign_cpu_pct") is not None and 0.0 <= m["foreign_cpu_pct"] <= 100.0  # type: ignore[operator]
    assert set(result.details["calibration"]) == {"before", "after"}

"""Hardware discovery: the real CPU, GPUs through a fake libnvidia-ml.so.1 and the real pynvml."""
from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

import pytest

from schemas import CpuInfo, GpuInfo
from tests.workers.samplers.conftest import run_py, write_state
from workers.hardware import detect_cpu, queues_for

GIB = 1 << 30

TWO_PRODUCTS = """driver 550.54.15
gpu 0 uuid GPU-11111111-aaaa-bbbb-cccc-000000000000
gpu 0 name NVIDIA A100-SXM4-40GB
gpu 0 mem_total 42949672960
gpu 0 cc 8 0
gpu 1 uuid GPU-22222222-aaaa-bbbb-cccc-000000000000
gpu 1 name NVIDIA A100-SXM4-40GB
gpu 1 mem_total 42949672960
gpu 1 cc 8 0
gpu 2 uuid GPU-33333333-aaaa-bbbb-cccc-000000000000
gpu 2 name Tesla T4
gpu 2 mem_total 16106127360
gpu 2 cc 7 5
"""

DETECT = "from workers.hardware import detect_hardware; print(detect_hardware(docker=True).model_dump_json())"


def _cpuinfo_model() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def test_detect_cpu_reports_this_machine() -> None:
    cpu = detect_cpu()
    assert cpu.logical_cores == os.cpu_count()
    assert cpu.memory_bytes > 256 * (1 << 20)
    assert cpu.arch
    expected = _cpuinfo_model()
    if expected:
        assert cpu.model == expected


def _gpu(i: int, name: str) -> GpuInfo:
    from schemas.request import device_slug

    return GpuInfo(index=i, uuid=f"GPU-{i}", name=name, slug=device_slug(name), memory_total_bytes=GIB)


def test_queues_for_cpu_only_and_distinct_products() -> None:
    cpu = CpuInfo(logical_cores=2, memory_bytes=GIB)
    assert queues_for(cpu, []) == ["farm.cpu", "farm.edge"]
    gpus = [_gpu(0, "NVIDIA A100-SXM4-40GB"), _gpu(1, "NVIDIA A100-SXM4-40GB"), _gpu(2, "Tesla T4")]
    assert queues_for(cpu, gpus) == ["farm.cpu", "farm.edge", "farm.gpu.a100-sxm4-40gb", "farm.gpu.t4"]


def test_detect_hardware_lists_fake_gpus_through_real_pynvml(fake_nvml_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS)
    hw = run_py(DETECT, fake_nvml_dir, state)
    assert hw["docker"] is True
    assert [g["index"] for g in hw["gpus"]] == [0, 1, 2]
    a100, _, t4 = hw["gpus"]
    assert a100["uuid"] == "GPU-11111111-aaaa-bbbb-cccc-000000000000"
    assert a100["name"] == "NVIDIA A100-SXM4-40GB"
    assert a100["slug"] == "a100-sxm4-40gb"
    assert a100["memory_total_bytes"] == 42949672960
    assert a100["driver_version"] == "550.54.15"
    assert a100["cuda_compute_capability"] == "8.0"
    assert t4["slug"] == "t4" and t4["cuda_compute_capability"] == "7.5"
    assert hw["queues"] == ["farm.cpu", "farm.edge", "farm.gpu.a100-sxm4-40gb", "farm.gpu.t4"]
    assert hw["cpu"]["logical_cores"] == os.cpu_count()


@pytest.mark.parametrize("code", [9, 999], ids=["driver-not-loaded", "unknown-error"])
def test_detect_gpus_is_empty_when_nvml_init_fails(fake_nvml_dir: Path, tmp_path: Path, code: int) -> None:
    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS + f"init_error {code}\n")
    hw = run_py(DETECT, fake_nvml_dir, state)
    assert hw["gpus"] == []
    assert hw["queues"] == ["farm.cpu", "farm.edge"]


def test_detect_gpus_is_empty_without_the_library(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine; absence cannot be simulated")
    empty = tmp_path / "no-nvml"
    empty.mkdir()
    got = run_py(
        "import json, pynvml\n"
        "from workers.hardware import detect_gpus\n"
        "gpus = detect_gpus()\n"
        "try:\n    pynvml.nvmlInit(); err = None\n"
        "except pynvml.NVMLError as e:\n    err = type(e).__name__\n"
        "print(json.dumps({'gpus': [g.model_dump() for g in gpus], 'err': err}))",
        empty,
    )
    assert got == {"gpus": [], "err": "NVMLError_LibraryNotFound"}


def test_an_embedded_submit_runs_gpu_jobs_on_this_hosts_gpus(fake_nvml_dir: Path, tmp_path: Path) -> None:
    """``--device gpu`` in the embedded default means this host's GPUs, as its dry run says (it was refused with
    "no worker with a GPU is online" on a GPU host: no worker is registered before an embedded run starts)."""
    import json
    import subprocess
    import sys

    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_") or k.startswith("FARM_TEST_")}
    env.update(LD_LIBRARY_PATH=str(fake_nvml_dir), FAKE_NVML_STATE=str(state), FARM_HOME=str(tmp_path / "home"),
               FARM_NOOP_JOBS="1")  # the dispatch harness: the jobs complete without serving (no CUDA here)

    def farm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "farm", *args], env=env, capture_output=True, text=True,
                              timeout=300, cwd=Path(__file__).resolve().parents[3])

    assert farm("example-model", str(tmp_path / "m.onnx"), "--kind", "identity").returncode == 0
    dry = farm("submit", str(tmp_path / "m.onnx"), "--device", "gpu", "--dry-run", "--json")
    run = farm("submit", str(tmp_path / "m.onnx"), "--device", "gpu", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    planned = sorted(j["device"] for j in json.loads(dry.stdout)["jobs"])
    rows = json.loads(farm("results", json.loads(run.stdout)["request_id"], "--format", "json").stdout)
    assert planned == sorted(r["device"] for r in rows) == ["gpu:a100-sxm4-40gb", "gpu:t4"]
    assert {r["status"] for r in rows} == {"succeeded"}

"""NvmlSampler against the fake libnvidia-ml.so.1 through the real pynvml, in a subprocess whose state
file changes while sampling (idle -> server loaded -> server at peak)."""
from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.workers.samplers.conftest import run_py, write_state

MIB = 1 << 20
UUID0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
SERVER_PID = 4242


def gpu_state(mem_used_mib: int, util: int, power_mw: int, procs: Sequence[tuple[int, int]] = ()) -> str:
    """GPU 0 is the one sampled; GPU 1 (another job's) is busy and must not leak into the figures."""
    lines = [
        "driver 550.54.15",
        f"gpu 0 uuid {UUID0}",
        "gpu 0 name NVIDIA L4",
        f"gpu 0 mem_total {24 * 1024 * MIB}",
        f"gpu 0 mem_used {mem_used_mib * MIB}",
        f"gpu 0 util_gpu {util}",
        f"gpu 0 util_mem {util // 2}",
        f"gpu 0 power_mw {power_mw}",
        *(f"gpu 0 proc {pid} {mib * MIB if mib >= 0 else -1}" for pid, mib in procs),
        f"gpu 1 uuid {UUID1}",
        "gpu 1 name NVIDIA L4",
        f"gpu 1 mem_total {24 * 1024 * MIB}",
        f"gpu 1 mem_used {20000 * MIB}",
        "gpu 1 util_gpu 100",
        "gpu 1 power_mw 70000",
    ]
    return "\n".join(lines) + "\n"


# The scenario runs in the subprocess: the sampler is entered at idle (baseline), then the "server"
# loads (phase 1) and peaks (phase 2); the state file is rewritten between phases.
SCENARIO = """
import json, os, time
from workers.samplers.nvml import NvmlSampler
state = os.environ["FAKE_NVML_STATE"]
phases = json.loads({phases!r})
def put(text):
    open(state + ".tmp", "w").write(text); os.replace(state + ".tmp", state)
pids = {pids}
s = NvmlSampler([{uuid!r}], pids=(lambda: pids) if pids is not None else None, interval_s=0.02)
{pre}
with s:
    for text in phases:
        put(text)
        time.sleep(0.4)
print(json.dumps({{"summary": s.summary(), "details": s.details(), "series": s.series()}}))
"""


def scenario(lib: Path, state: Path, idle: str, phases: list[str], pids: set[int] | None, pre: str = "") -> Any:
    write_state(state, idle)
    code = SCENARIO.format(phases=json.dumps(phases), pids=repr(pids), uuid=UUID0, pre=pre)
    return run_py(code, lib, state)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "nvml.state"


IDLE = gpu_state(400, 0, 30_000)
LOADED = gpu_state(2400, 80, 200_000, [(SERVER_PID, 1800), (999, 150)])
PEAK = gpu_state(3400, 60, 150_000, [(SERVER_PID, 2800), (999, 150)])


def test_peak_from_server_processes_util_and_watts(fake_nvml_dir: Path, state: Path) -> None:
    out = scenario(fake_nvml_dir, state, IDLE, [LOADED, PEAK], {SERVER_PID})
    summary, details, series = out["summary"], out["details"], out["series"]
    assert details["baseline"]["mem_used"] == 400 * MIB
    assert details["baseline"]["power_w"] == 30.0  # mW -> W
    assert details["mem_source"] == "processes"
    # The server process's own memory, not the other pid's, not the device total, not GPU 1.
    assert summary["gpu_mem_peak_bytes"] == 2800 * MIB
    assert details["device_mem_peak_bytes"] == 3400 * MIB
    assert summary["gpu_util_avg_pct"] == pytest.approx(statistics.fmean(s["util"] for s in series))
    assert summary["gpu_power_avg_w"] == pytest.approx(statistics.fmean(s["power_w"] for s in series))
    assert {s["util"] for s in series} <= {0.0, 80.0, 60.0}
    assert {s["power_w"] for s in series} <= {30.0, 200.0, 150.0}
    assert sum(1 for s in series if s["util"] == 80.0) >= 3 and sum(1 for s in series if s["util"] == 60.0) >= 3
    assert details["samples"] >= 10 and details["error"] is None


def test_peak_falls_back_to_device_minus_baseline(fake_nvml_dir: Path, state: Path) -> None:
    # No pids given, and pids given but the driver cannot attribute memory (usedGpuMemory unavailable).
    unattributed = [
        gpu_state(2400, 80, 200_000, [(SERVER_PID, -1)]),
        gpu_state(3400, 60, 150_000, [(SERVER_PID, -1)]),
    ]
    for pids, phases in ((None, [LOADED, PEAK]), ({SERVER_PID}, unattributed)):
        out = scenario(fake_nvml_dir, state, IDLE, phases, pids)
        assert out["details"]["mem_source"] == "device_minus_baseline"
        assert out["summary"]["gpu_mem_peak_bytes"] == (3400 - 400) * MIB


def test_take_baseline_before_entering_keeps_the_idle_figures(fake_nvml_dir: Path, state: Path) -> None:
    # Baseline taken at idle; the server then starts before the sampler is entered.
    pre = f"s.take_baseline()\nput({LOADED!r})"
    out = scenario(fake_nvml_dir, state, IDLE, [PEAK], None, pre=pre)
    assert out["details"]["baseline"]["mem_used"] == 400 * MIB
    assert out["summary"]["gpu_mem_peak_bytes"] == 3000 * MIB


def test_power_not_supported_leaves_power_out(fake_nvml_dir: Path, state: Path) -> None:
    no_power = gpu_state(1400, 50, -1)
    out = scenario(fake_nvml_dir, state, gpu_state(400, 0, -1), [no_power], None)
    assert "gpu_power_avg_w" not in out["summary"]
    assert out["details"]["power_supported"] is False
    assert out["summary"]["gpu_util_avg_pct"] > 0
    assert out["summary"]["gpu_mem_peak_bytes"] == 1000 * MIB


def test_unknown_uuid_is_a_sampler_error(fake_nvml_dir: Path, state: Path) -> None:
    write_state(state, IDLE)
    out = run_py(
        "import json\nfrom farm.errors import SamplerError\nfrom workers.samplers.nvml import NvmlSampler\n"
        "try:\n    NvmlSampler(['GPU-nope']).__enter__(); msg = None\n"
        "except SamplerError as e:\n    msg = str(e)\n"
        "print(json.dumps(msg))",
        fake_nvml_dir, state,
    )
    assert out is not None and "GPU-nope" in out and "nvidia-smi" in out


@pytest.mark.gpu
def test_real_gpu_when_present() -> None:
    """On a machine with an NVIDIA GPU: detection and a short sampling run through the real driver."""
    import time

    from workers.hardware import detect_gpus
    from workers.samplers.nvml import NvmlSampler

    gpus = detect_gpus()
    if not gpus:
        pytest.skip("no NVIDIA GPU or driver on this machine")
    g = gpus[0]
    assert g.uuid.startswith(("GPU-", "MIG-")) and g.memory_total_bytes > 0 and g.slug
    with NvmlSampler([g.uuid]) as s:
        time.sleep(0.5)
    summary, details = s.summary(), s.details()
    assert details["error"] is None and details["samples"] >= 5
    assert 0.0 <= summary["gpu_util_avg_pct"] <= 100.0
    assert 0 <= summary["gpu_mem_peak_bytes"] <= g.memory_total_bytes
    print(f"{g.name}: {summary}, baseline {details['baseline']}")

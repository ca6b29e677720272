"""vLLM for real, where a GPU and vLLM are present (skipped elsewhere, with the reason): farm launches it on the
tiny-llama example and measures it (``benchmarks/vllm_gpu.py --quick``: ``farm submit --engine vllm`` on the
first GPU, concurrency 1 and 8), each row holds the LLM figures and the GPU's, and no vLLM process outlives the
run. Setup on a GPU host: docs/llm-engines.md ("vLLM on GPU workers")."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.workers.samplers.conftest import REPO

SCRIPT = REPO / "benchmarks" / "vllm_gpu.py"


def _vllm_processes(since: float) -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline", "create_time", "name"]):
        cmd = " ".join(p.info["cmdline"] or [])
        ours = "vllm.entrypoints" in cmd or "EngineCore" in (p.info["name"] or "")
        if ours and (p.info["create_time"] or 0) >= since:
            out.append(f"{p.pid} {cmd[:120]}")
    return out


@pytest.mark.gpu
@pytest.mark.slow
def test_vllm_serves_the_tiny_llama_on_a_gpu_with_nvml_figures(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.vllm_gpu import why_not  # noqa: PLC0415 - the script's own preconditions

    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    started = time.time()
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out)], capture_output=True,
                          text=True, timeout=1500, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert sorted(r["concurrency"] for r in rows) == [1, 8] and {r["engine"] for r in rows} == {"vllm"}
    for r in rows:
        assert r["status"] == "succeeded" and r["error_count"] == 0, r
        assert r["ttft_p50_ms"] > 0 and r["itl_p50_ms"] > 0 and r["output_tokens_per_s"] > 0
        assert r["mean_output_tokens"] == 128  # the tiny model never stops early (docs/llm-engines.md)
        assert r["gpu_mem_peak_bytes"] > 100 << 20  # weights, CUDA context and vLLM's KV cache
        assert r["gpu_util_avg_pct"] is not None and r["gpu_power_avg_w"] is not None and r["gpu_power_avg_w"] > 0
    assert _vllm_processes(started) == []  # the server and its engine core are gone

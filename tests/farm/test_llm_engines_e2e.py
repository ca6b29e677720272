"""An LLM model file end to end, as a user runs it: ``farm submit tiny-llama.gguf`` (or the Hugging Face folder)
makes farm launch the engine (llama.cpp, transformers serve) on its leased cores through the process runner, drive
it with the OpenAI streaming client, and store the LLM figures; the token counts come from the server or from the
model's own tokenizer, and every request asked for the output length the workload set."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import farm, farm_env

pytestmark = pytest.mark.llm

SHORT = ["--duration", "2", "--window", "1", "--warmup", "0.5", "--input-tokens", "24", "--output-tokens", "16"]


def _rows(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    out = farm("submit", *args, *SHORT, "--json", env=env, timeout=420)
    rid = json.loads(out.stdout)["request_id"]
    rows: list[dict[str, Any]] = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    return rows


def test_llama_cpp_launched_by_farm_is_measured_over_the_openai_api(tiny_llama: Any) -> None:
    """No --api needed: a GGUF file goes to llama.cpp, whose jobs the OpenAI client measures; an SLO gives goodput."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install 'farm[llm]'")
    env = farm_env()
    rows = _rows(env, str(tiny_llama.gguf), "--concurrency", "1,2", "--slo", "ttft=5000,tpot=1000")
    assert sorted(r["concurrency"] for r in rows) == [1, 2]
    for r in rows:
        assert r["status"] == "succeeded", r.get("error")
        assert r["engine"] == "llama.cpp" and r["client"] == "openai"
        assert r["output_tokens_per_s"] > 0 and r["ttft_p50_ms"] > 0 and r["itl_p50_ms"] > 0
        assert r["tpot_p50_ms"] > 0 and r["latency_p50_ms"] >= r["ttft_p50_ms"]
        assert r["error_count"] == 0
        # the tiny model always runs to max_tokens (its output rows keep it on printable tokens): 16 asked, 16 made
        assert r["mean_output_tokens"] == pytest.approx(16, abs=1)
        # the prompts cut by the server's own tokenizer (llama-cpp-python's /extras/tokenize), the chat template's
        # tokens measured on the probe: 24 by its count, within 2 % (a word may merge with the template's text)
        assert r["requested_input_tokens_mean"] == pytest.approx(24, rel=0.02)
        assert r["input_tokens_off_pct"] == pytest.approx(0, abs=2)
        assert r["workload_as_asked"] is not False and r["ttfot_p50_ms"] == pytest.approx(r["ttft_p50_ms"])
        assert r["goodput_req_per_s"] == pytest.approx(r["requests_per_s"], rel=0.05)


@pytest.mark.slow
def test_transformers_serve_launched_by_farm_on_the_hf_folder(tiny_llama: Any) -> None:
    """A Hugging Face folder goes to ``transformers serve``, which reports usage: the counts come from the server."""
    pytest.importorskip("transformers", reason="transformers is not installed: pip install 'farm[llm]'")
    env = farm_env()
    rows = _rows(env, str(tiny_llama.hf), "--concurrency", "1")
    (r,) = rows
    assert r["status"] == "succeeded", r.get("error")
    assert r["engine"] == "transformers" and r["client"] == "openai"
    assert r["output_tokens_per_s"] > 0 and r["ttft_p50_ms"] > 0
    assert r["mean_output_tokens"] == pytest.approx(16, abs=1)


def test_llm_options_on_an_onnx_model_are_left_out_with_the_reason(tmp_path: Path, example_onnx: Path) -> None:
    """--input-tokens asks for an LLM workload; an ONNX model's engine speaks KServe v2: the job is left out, said."""
    env = farm_env()
    proc = farm("submit", str(example_onnx), "--input-tokens", "16", "--dry-run", env=env, check=False)
    assert "not the OpenAI API" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_llama_cpp_rows_carry_their_knobs_threads_and_workload_as_columns(tiny_llama: Any) -> None:
    """A knob sweep on llama.cpp: each row stores the knobs its server ran with (n_threads filled in from the
    job's core lease), the workload and the model file's hash, as columns of ``farm results``, of the CSV export
    and of the SQL view ``job_results``."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install 'farm[llm]'")
    import sqlite3

    env = farm_env()
    out = farm("submit", str(tiny_llama.gguf), *SHORT, "--knob", "n_ctx=256,512", "--json", env=env, timeout=420)
    rid = json.loads(out.stdout)["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    assert sorted(r["knobs"]["n_ctx"] for r in rows) == [256, 512]
    for r in rows:
        assert r["status"] == "succeeded", r.get("error")
        cores = len(_cpus(r["server_cpus"]))
        assert r["knobs"]["n_threads"] == r["n_threads"] == cores >= 1  # the lease's core count, as the server got it
        assert (r["input_tokens"], r["output_tokens"], r["prefix_tokens"], r["workload_seed"]) == ("24", "16", 0, 0)
        assert r["token_source"] in ("usage", "tokenizer", "chunks") and r["prompts"] is None
        assert len(r["model_sha256"]) == 64
    table = farm("results", rid, "--columns", "knobs,n_threads,output_tokens_per_s", env=env).stdout
    assert "n_ctx=256" in table and "n_ctx=512" in table and "n_threads" in table
    csv_text = farm("results", rid, "--format", "csv", env=env).stdout
    assert '"{""n_ctx"": 256' in csv_text  # knobs as JSON text in a CSV cell
    with sqlite3.connect(Path(env["FARM_HOME"]) / "farm.db") as con:  # the embedded database
        got = con.execute("SELECT json_extract(knobs, '$.n_ctx'), n_threads, output_tokens, model_sha256 "
                          "FROM job_results WHERE request_id = ? ORDER BY 1", (rid,)).fetchall()
    assert [g[0] for g in got] == [256, 512] and all(g[1] >= 1 and g[2] == "16" and len(g[3]) == 64 for g in got)


def _cpus(text: str) -> set[int]:
    """``0-1,3`` as {0, 1, 3}."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def _cgroups_limit() -> bool:
    """Whether this host lets farm create a memory- and CPU-limited cgroup (root, or a delegated cgroup)."""
    from workers.limits import LimitedCgroup

    with LimitedCgroup(cpus=1.0, memory_bytes=256 * 2**20) as cg:
        return cg.enforced


def test_llama_cpp_under_edge_limits_fits_the_slo_or_is_killed_out_of_memory(tiny_llama: Any) -> None:
    """``--edge`` on a GGUF file: farm starts llama.cpp inside the edge profile's cgroup and drives it over HTTP;
    the 512 MiB box fits the SLO with its memory peak under the limit, the 40 MiB box kills the server while it
    loads: an OOM verdict (a failed row saying so), not a crash; ``farm report`` gives both verdicts."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install 'farm[llm]'")
    if not _cgroups_limit():
        pytest.skip("this host does not let farm create limited cgroups (run as root or in a delegated cgroup)")
    env = farm_env(FARM_LLAMA_SERVER="off")  # llama-cpp-python's server: its memory is what the profiles are sized to
    out = farm("submit", str(tiny_llama.gguf), *SHORT, "--edge", "cpus=1,memory=512m,name=box", "--edge",
               "cpus=1,memory=40m,name=tiny", "--slo", "ttft=5000,tpot=1000", "--json", env=env, timeout=420)
    rid = json.loads(out.stdout)["request_id"]
    rows = {r["edge_profile"]: r for r in json.loads(farm("results", rid, "--format", "json", env=env).stdout)}
    box, tiny = rows["box"], rows["tiny"]
    assert box["status"] == "succeeded", box.get("error")
    assert box["limits_enforced"] is True and box["oom_killed"] is False and box["mem_limit_bytes"] == 512 * 2**20
    assert 0 < box["mem_peak_bytes"] < box["mem_limit_bytes"] and box["output_tokens_per_s"] > 0
    assert box["goodput_req_per_s"] == pytest.approx(box["requests_per_s"], rel=0.05) and box["n_threads"] == 1
    assert "held to the edge profile's CPU and memory limits" in box["measured"]
    assert tiny["status"] == "failed" and tiny["oom_killed"] is True and "killed: out of memory" in tiny["error"]
    report = json.loads(farm("report", rid, "--json", env=env).stdout)
    verdicts = {e["edge_profile"]: e for e in report["edge"]}
    assert verdicts["box"]["fits"] is True and verdicts["box"]["within_slo_pct"] >= 95
    assert verdicts["tiny"]["fits"] is False and verdicts["tiny"]["oom"] is True
    assert verdicts["tiny"]["reason"] == "killed: out of memory"

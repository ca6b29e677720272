"""``farm submit --endpoint http://HOST:PORT --api openai-chat --model-name NAME`` end to end through the
embedded path, against the fake OpenAI server: the LLM columns in results, the SQL view and exports; bad input
as one-line usage errors; the API key never stored."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq

from schemas.measured import MEASURED_LLM
from tests.fake_openai import fake_server
from tests.helpers import farm, farm_env

LLM = ["--duration", "1", "--window", "0.5", "--warmup", "0.3", "--input-tokens", "16", "--output-tokens", "8"]


def test_submit_profiles_an_openai_endpoint(tmp_path: Path) -> None:
    """The server asks for a key: the request names the operator's credential, the worker sends its value."""
    env = farm_env(LLM_TEST_KEY="s3cret-key-value", FARM_ENDPOINT_CREDENTIALS="tiny-key=env:LLM_TEST_KEY")
    with fake_server(model="tiny", ttft_ms=5, itl_ms=1, api_key="s3cret-key-value") as url:
        out = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "tiny", "--credential",
                   "tiny-key", "--concurrency", "1,4", "--slo", "ttft=5000", *LLM, "--json", env=env)
    rid = json.loads(out.stdout)["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    assert sorted(r["concurrency"] for r in rows) == [1, 4] and {r["status"] for r in rows} == {"succeeded"}
    for r in rows:
        assert r["ttft_p50_ms"] >= 5 and r["itl_p50_ms"] > 0 and r["mean_output_tokens"] == 8
        assert r["output_tokens_per_s"] > 0 and r["goodput_req_per_s"] == r["requests_per_s"]
    table = farm("results", rid, env=env).stdout
    assert "(load sent by openai)" in table and "ttft" in table.lower()  # the LLM table: its own columns
    pq_file = tmp_path / "r.parquet"
    farm("results", rid, "--format", "parquet", "-o", str(pq_file), env=env)
    assert {"ttft_p50_ms", "itl_p99_ms", "output_tokens_per_s"} <= set(pq.read_table(pq_file).column_names)
    dbs = list(Path(env["FARM_HOME"]).rglob("*.db"))
    assert dbs
    for path in dbs:
        raw = path.read_bytes()
        assert b"s3cret-key-value" not in raw  # the key is never stored
        with sqlite3.connect(path) as con:
            got = con.execute("SELECT ttft_p50_ms, output_tokens_per_s, rpc, measured FROM job_results "
                              "WHERE request_id = ?", (rid,)).fetchall()
        assert len(got) == 2 and all(v is not None for row in got for v in row)
        assert {(row[2], row[3]) for row in got} == {("sse", MEASURED_LLM)}


def test_bad_llm_input_is_a_one_line_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with fake_server(model="tiny") as url:
        cases = [(["--model-name", "nope"], "does not serve model 'nope'"),
                 (["--model-name", "tiny", "--prompts", str(bad)], "line 2 is not JSON"),
                 (["--model-name", "tiny", "--slo", "ttfb=3"], "ttfb=3"),
                 (["--model-name", "tiny", "--output-tokens", "9:2"], "min > max"),
                 (["--model-name", "tiny", "--tokenizer", str(tmp_path / "none")], "no such file")]
        for args, text in cases:
            proc = farm("submit", "--endpoint", url, "--api", "openai-chat", *LLM, *args, check=False)
            assert proc.returncode == 2, (args, proc.stderr)
            assert text in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "tiny", *LLM, check=False)
    assert proc.returncode == 2 and "cannot reach" in proc.stderr and "Traceback" not in proc.stderr

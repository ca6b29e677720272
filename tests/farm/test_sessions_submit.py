"""``farm submit --sessions`` end to end on the embedded path (issue 41 point 3): against the fake OpenAI server,
sessions at a concurrency and at a rate, the per-turn figures stored as the row's columns and shown by ``farm
results`` and ``farm report``; bad sessions input refused at submit in one line, before any job; and on a real
llama-server (the tiny random GGUF) the share of prompt tokens it serves from its cache rising with the turn, where
it reports cached tokens."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.fake_openai import fake_server
from tests.helpers import assert_refused, farm, farm_env

FAKE = ["--api", "openai-chat", "--model-name", "tiny", "--duration", "1.5", "--window", "0.5", "--warmup", "0.3",
        "--input-tokens", "12", "--output-tokens", "4"]


def _rows(rid: str, env: dict[str, str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    return rows


def test_sessions_at_a_concurrency_and_a_rate_store_their_turns(tmp_path: Path) -> None:
    env = farm_env()
    with fake_server(model="tiny", ttft_ms=5, itl_ms=1, cache=True) as url:
        out = farm("submit", "--endpoint", url, *FAKE, "--sessions", "3", "--think-ms", "20", "-c", "2", "--json",
                   env=env)
        rid = json.loads(out.stdout)["request_id"]
        rate = farm("submit", "--endpoint", url, *FAKE, "--sessions", "3", "--rate", "8", "--json", env=env)
        rid_rate = json.loads(rate.stdout)["request_id"]
    for request, think in ((rid, 20), (rid_rate, 0)):
        (row,) = _rows(request, env)
        assert row["status"] == "succeeded", row.get("error")
        assert row["error_count"] == 0 and row["prompts"] == f"sessions: 3 turns in 12, think {think} ms"
        assert all(row[f"turn{k}_ttft_p50_ms"] is not None for k in (1, 2, 3)) and row["turn4_ttft_p50_ms"] is None
        assert row["turn1_cached_prompt_tokens_pct"] == 0 < row["turn2_cached_prompt_tokens_pct"]
    assert _rows(rid_rate, env)[0]["rate"] == 8 and _rows(rid, env)[0]["rate"] is None  # sessions/s; closed loop
    table = farm("results", rid, env=env).stdout
    assert "per turn 1-3: TTFT p50 ms" in table and "prompt tokens from cache %" in table
    assert "per turn 1-3" in farm("report", rid, env=env).stdout
    with sqlite3.connect(Path(env["FARM_HOME"]) / "farm.db") as con:  # the typed columns, and every turn's figures
        (cached, details) = con.execute("SELECT turn2_cached_prompt_tokens_pct, details FROM results").fetchone()
    assert cached > 0 and [t["turn"] for t in json.loads(details)["load"]["session_turns"]] == [1, 2, 3]


def test_bad_sessions_input_is_a_one_line_usage_error(tmp_path: Path) -> None:
    single = tmp_path / "single.json"
    single.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
                                  {"conversations": [{"from": "human", "value": "alone"}]}]))
    cases = [(["--sessions", "sharegpt", "--prompts", str(single)], "holds no multi-turn conversation"),
             (["--sessions", "0"], "a session has 1 to 1000 turns"),
             (["--sessions", "3", "--think-ms", "-5"], "think_ms"),
             (["--think-ms", "5"], "add --sessions"),
             (["--sessions", "sharegpt"], "give --prompts FILE")]
    env = farm_env()
    with fake_server(model="tiny") as url:
        assert_refused(cases, ["--endpoint", url, "--api", "openai-chat", "--model-name", "tiny"], env)


@pytest.mark.llm
def test_llama_server_serves_more_of_each_later_turn_from_its_cache(llama_server: str, tiny_llama: Any) -> None:
    """4-turn sessions one at a time on llama-server: turn k's prompt is turn k-1's prompt and answer and 24 tokens
    more, so the share of it the server takes from its prompt cache rises with k (where it reports cached tokens:
    ``timings.cache_n`` or ``usage.prompt_tokens_details.cached_tokens``)."""
    env = farm_env()
    out = farm("submit", str(tiny_llama.gguf), "--engine", "llama.cpp", "--api", "openai-completions", "--sessions",
               "4", "--input-tokens", "24", "--output-tokens", "8", "-c", "1", "--duration", "3", "--window", "1",
               "--warmup", "0.5", "--json", env=env, timeout=420)
    (row,) = _rows(json.loads(out.stdout)["request_id"], env)
    assert row["status"] == "succeeded", row.get("error")
    cached = [row[f"turn{k}_cached_prompt_tokens_pct"] for k in (1, 2, 3, 4)]
    if all(c is None for c in cached):
        pytest.skip("this llama-server reports no cached prompt tokens")
    assert cached[0] < 50 and cached[0] < cached[1] < cached[2] < cached[3], cached

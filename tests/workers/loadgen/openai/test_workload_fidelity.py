"""The workload the server sees is the one asked (issue 41 points 1 and 5), against the scripted fake server
(tests/fake_openai.py): prompts cut by the server's /tokenize and checked against its usage, outputs run to
max_tokens with ignore_eos, per-request salts that leave its prefix cache cold, and a reasoning model's stream
(reasoning, then content, then tool calls) counted apart; the row's typed checks and notes on scripted outcomes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.llm import LlmSettings
from tests.fake_openai import fake_server
from tests.workers.loadgen.openai.test_openai_client import _measure, stored
from workers.loadgen.openai.fidelity import workload_metrics, workload_notes
from workers.loadgen.openai.request import request_body
from workers.loadgen.openai.stream import Outcome, RawRequest, account, feed_line
from workers.loadgen.openai.workload import SALT_WORDS, Salts, synthetic_prompts

OUT = 12


def test_a_reasoning_stream_is_counted_apart_and_tool_calls_as_output() -> None:
    """5 reasoning tokens, then content, then 3 tool-call tokens: TTFT to the first reasoning token, TTFOT to the
    first content one (later), reasoning and answer tokens/s adding up to all the generated tokens/s."""
    with fake_server(model="fake", ttft_ms=10, itl_ms=2, reasoning=5, tool_tokens=3) as url:
        r = _measure(url)
    m = r.metrics
    assert m["error_count"] == 0 and m["mean_output_tokens"] == OUT and m["mean_reasoning_tokens"] == 5
    assert m["ttfot_p50_ms"] > m["ttft_p50_ms"] and m["ttfot_p99_ms"] >= m["ttfot_p50_ms"]
    assert m["reasoning_tokens_per_s"] + m["answer_tokens_per_s"] == pytest.approx(m["output_tokens_per_s"])
    assert m["reasoning_tokens_per_s"] / m["output_tokens_per_s"] == pytest.approx(5 / OUT, rel=0.15)


def test_stream_kinds_on_scripted_lines() -> None:
    rec = RawRequest(scheduled=0.0, sent=0.0, warm=False, prompt_tokens=3, prompt_source="words", max_tokens=4)
    events = [{"delta": {"reasoning": "hm"}}, {"delta": {"reasoning_content": "so"}}, {"delta": {"content": "A"}},
              {"delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}}]
    for t, delta in enumerate(events, 1):
        feed_line(rec, b"data: " + json.dumps({"choices": [delta]}).encode(), t / 10)
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}
    feed_line(rec, b"data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "tool_calls"}],
                                           "usage": usage}).encode(), 0.5)
    assert rec.chunk_kind == ["reasoning", "reasoning", "content", "tool"] and rec.chunk_text[3] == "f{}"
    o = account(rec, None)
    assert o.reasoning_tokens == 2 and o.output_tokens == 4 and o.cached_tokens == 2
    assert o.ttft_ms == pytest.approx(100.0) and o.ttfot_ms == pytest.approx(300.0)


def test_prompts_cut_by_the_servers_tokenize_match_its_count_and_share_no_prefix() -> None:
    """The fake serves llama.cpp's /tokenize (a BOS with add_special) and counts a BOS in usage: the prompts
    farm cuts by it are the server's 16 tokens exactly; each request's salt leaves its prefix cache cold."""
    with fake_server(model="fake", tokenize=True, cache=True) as url:
        r = _measure(url, input_tokens=16)
    m, d = r.metrics, r.details
    assert "llama.cpp /tokenize" in d["workload"]["prompts_cut_by"]
    assert m["mean_input_tokens"] == m["requested_input_tokens_mean"] == 16
    assert m["input_tokens_off_pct"] == 0 and m["output_tokens_off_pct"] == 0 and m["workload_as_asked"] is True
    assert m["cached_prompt_tokens_pct"] == 0 and not any("not as asked" in n for n in d["notes"])


def test_a_chat_templates_tokens_are_measured_and_counted() -> None:
    """A chat template adds 7 tokens to every prompt's count: measured on the probe, the prompts are cut 7 shorter
    and the server counts the 16 asked."""
    with fake_server(model="fake", tokenize=True, template=7) as url:
        r = _measure(url, input_tokens=16)
    assert r.metrics["mean_input_tokens"] == 16 and r.metrics["input_tokens_off_pct"] == 0
    with fake_server(model="fake", template=7) as url:  # words and no tokenizer: nothing to cut by, flagged
        r = _measure(url, input_tokens=16)
    assert r.metrics["mean_input_tokens"] == 23 and r.metrics["workload_as_asked"] is False
    assert any("chat template" in n for n in r.details["notes"])


def test_a_shared_prefix_is_cached_as_asked_and_nothing_more() -> None:
    """An 8-token prefix on 16-token prompts: the server caches the prefix's share of the prompt tokens."""
    with fake_server(model="fake", tokenize=True, cache=True) as url:
        r = _measure(url, input_tokens=16, prefix_tokens=8)
    m = r.metrics
    assert m["mean_input_tokens"] == 24 and m["input_tokens_off_pct"] == 0
    # the prefix (8 words) after a BOS the fake does not see as a word: its two 4-word blocks, of 24 prompt tokens
    assert m["cached_prompt_tokens_pct"] == pytest.approx(100 * 8 / 24, abs=2)
    assert not any("prefix cache" in n for n in r.details["notes"])


def test_one_prompt_file_repeated_hits_no_cache_for_its_salts(tmp_path: Path, sqlite_url: str) -> None:
    """A file of one prompt sent over and over: without salts every request after the first would be served from
    the cache; with them none is."""
    jsonl = tmp_path / "one.jsonl"
    jsonl.write_text(json.dumps({"prompt": " ".join(["same words"] * 20)}) + "\n")
    with fake_server(model="fake", cache=True) as url:
        r = _measure(url, prompts=stored("prompts", jsonl))
    assert r.metrics["cached_prompt_tokens_pct"] == 0 and r.metrics["requests_per_s"] > 0


def test_outputs_run_to_max_tokens_where_the_server_takes_ignore_eos() -> None:
    """The fake ends answers after 5 tokens unless asked ignore_eos: farm asks, and gets the 12 it asked for."""
    with fake_server(model="fake", eos_at=5) as url:
        r = _measure(url)
    assert r.details["workload"]["ignore_eos"] is True
    assert r.metrics["mean_output_tokens"] == OUT and r.metrics["output_tokens_off_pct"] == 0


def _outcome(**kw: Any) -> Outcome:
    base: dict[str, Any] = dict(end=1.0, ttft_ms=1.0, e2e_ms=2.0, tpot_ms=1.0, itl_ms=[1.0], input_tokens=441,
                                input_source="usage", output_tokens=61, output_source="usage", chunks=61,
                                overrun=False, server_ttft_ms=None, server_tpot_ms=None, input_requested=128,
                                output_requested=64, cached_tokens=200)
    return Outcome(**{**base, **kw})


def test_a_workload_not_as_asked_is_flagged_with_how_far() -> None:
    """The issue's own case: 441-token prompts for 128 asked, 61 outputs for 64, 45 % cache hits."""
    m = workload_metrics([_outcome(), _outcome(output_tokens=62)])
    assert m["requested_input_tokens_mean"] == 128 and m["input_tokens_off_pct"] == pytest.approx(244.5, abs=0.1)
    assert m["output_tokens_off_pct"] == pytest.approx((61.5 / 64 - 1) * 100)
    assert m["workload_as_asked"] is False and m["cached_prompt_tokens_pct"] == pytest.approx(100 * 200 / 441)
    notes = workload_notes(m, "openai-completions", 0, ignore_eos=False)
    assert any(n.startswith("prompts not as asked: 441.0 tokens") and "+244.5 %" in n for n in notes)
    assert any("outputs not as asked: 61.5 tokens" in n and "takes no ignore_eos" in n for n in notes)
    assert any("45 % of the prompt tokens from its prefix cache" in n for n in notes)
    words = workload_metrics([_outcome(input_source="words", input_tokens=128, output_source="chunks")])
    assert words["input_tokens_off_pct"] is None and words["workload_as_asked"] is False
    assert any(n.startswith("prompts approximate") for n in workload_notes(words, "openai-chat", 0, True))
    exact = workload_metrics([_outcome(input_tokens=128, output_tokens=64, cached_tokens=0)])
    assert exact["workload_as_asked"] is True and workload_notes(exact, "openai-chat", 0, True) == []


def test_the_body_holds_the_salt_and_ignore_eos() -> None:
    (p,) = synthetic_prompts(LlmSettings(input_tokens=10, output_tokens=3), None, 1)
    salts = Salts.of(None).started()
    a, b = (json.loads(request_body("openai-completions", "m", p, True, salts.salt(k))) for k in (1, 2))
    assert a["ignore_eos"] is True and a["max_tokens"] == 3 and a["prompt"].endswith(p.text)
    assert len(a["prompt"].split()) == p.input_tokens == 10 and a["prompt"].split()[:SALT_WORDS] != \
        b["prompt"].split()[:SALT_WORDS]
    chat = json.loads(request_body("openai-chat", "m", p, False, salts.salt(1)))
    assert "ignore_eos" not in chat and chat["messages"][0]["content"] == a["prompt"]

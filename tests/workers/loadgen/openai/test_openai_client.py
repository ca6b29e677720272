"""farm's OpenAI streaming client against the scripted fake server (tests/fake_openai.py, its own process):
figures, token truth, open loop, and every kind of bad answer as a counted error or a one-line LoadGenError."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from farm import workload_files
from farm.db.session import session_scope
from farm.errors import LoadGenError, RequestError
from farm.sandbox import jail_unavailable
from farm.settings import reset_settings
from schemas import MeasurementSettings
from schemas.llm import FileRef, LlmSettings
from tests.fake_openai import fake_server, word_tokenizer
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadResult, LoadSpec, LoadTarget
from workers.loadgen.openai.workload import SALT_WORDS, Salts, Tokenizer, file_prompts, synthetic_prompts

OUT = 12


def _measure(url: str, concurrency: int = 4, model: str = "fake", authority: str | None = None,
             in_flight_cap: int | None = None, **llm: Any) -> LoadResult:
    rate = llm.pop("rate", None)
    settings = MeasurementSettings(duration_s=1.0, warmup_s=0.3, window_s=0.5, rate=rate,
                                   llm={"api": "openai-chat", "input_tokens": 16, "output_tokens": OUT, **llm})
    return run_load(LoadTarget(url.split("//")[1], model, authority=authority, in_flight_cap=in_flight_cap),
                    LoadSpec.from_settings([], 1, concurrency, settings))


def stored(kind: str, path: Path) -> FileRef:
    """``path`` uploaded as a request's ``kind`` file into this test's database (a worker reads only those)."""
    up = workload_files.upload(kind, str(path))
    with session_scope() as s:
        workload_files.store(s, [up])
    return up.ref


def test_chat_figures_and_token_truth() -> None:
    with fake_server(model="fake", ttft_ms=15, itl_ms=2) as url:
        r = _measure(url, slo="ttft=10000,tpot=1000")
    m, d = r.metrics, r.details
    assert m["error_count"] == 0 and m["requests_per_s"] and m["requests_per_s"] > 0
    assert m["mean_output_tokens"] == OUT and m["mean_input_tokens"] == 16  # the server's usage
    assert d["token_sources"] == {"input": {"usage": d["token_sources"]["input"]["usage"]},
                                  "output": {"usage": d["token_sources"]["output"]["usage"]}}
    assert m["ttft_p50_ms"] >= 15 and m["itl_p50_ms"] >= 2 and m["tpot_p50_ms"] >= 2
    assert m["latency_p50_ms"] > m["ttft_p50_ms"]  # e2e is the result's latency
    # tokens counted by their arrival within the window, requests by their end: equal but for the window's edges,
    # where each of the 4 requests in flight at either end may count its tokens on one side only
    edges = 2 * 4 * OUT / (m.get("duration_s") or 1.0)
    assert abs(m["output_tokens_per_s"] - OUT * m["requests_per_s"]) <= max(0.1 * OUT * m["requests_per_s"], edges)
    assert m["goodput_req_per_s"] == pytest.approx(m["requests_per_s"])  # every request within a loose SLO
    assert m["output_overrun_count"] == 0 and d["tokens_per_chunk_mean"] == 1.0
    assert d["client"] == "openai" and d["rpc"] == "sse" and d["api"] == "openai-chat"
    # the server's own view, from its Prometheus histograms (vLLM's names): TTFT 15 ms falls in 10-20 ms
    assert 10 <= m["server_ttft_p50_ms"] <= 20 and 1 <= m["server_tpot_p50_ms"] <= 5


def test_completions_open_loop_chunked_without_usage() -> None:
    """An open loop at 20 requests/s; 3 tokens a chunk and no usage (as llama.cpp streams): counted one per
    chunk, and noted."""
    with fake_server(model="fake", ttft_ms=5, itl_ms=1, per_chunk=3, fault="no_usage") as url:
        r = _measure(url, api="openai-completions", rate=20.0)
    m, d = r.metrics, r.details
    assert d["mode"] == "constant" and d["rate"] == 20.0
    assert m["late_send_pct"] is not None and m["error_count"] == 0
    assert m["mean_output_tokens"] == OUT / 3 and d["token_sources"]["output"].keys() == {"chunks"}
    assert any("one per chunk" in n for n in d["notes"])


def test_overrun_is_flagged_on_the_row() -> None:
    with fake_server(model="fake", ttft_ms=2, itl_ms=1, fault="overrun") as url:
        r = _measure(url, concurrency=2)
    assert r.metrics["output_overrun_count"] and r.metrics["mean_output_tokens"] == OUT + 3
    assert any("max_tokens" in n for n in r.details["notes"])


@pytest.mark.parametrize(("fault", "name"), [("http500", "HTTP_500"), ("not_streaming", "NOT_STREAMING"),
                                             ("malformed", "MALFORMED_SSE"), ("truncate", "TRUNCATED")])
def test_bad_answers_are_counted_errors(fault: str, name: str) -> None:
    with fake_server(model="fake", ttft_ms=2, itl_ms=1, fault=fault) as url, \
            pytest.raises(LoadGenError, match=name) as err:
        _measure(url, concurrency=2)
    assert "\n" not in str(err.value)


def test_a_server_closing_each_connection_after_its_answer_costs_no_request() -> None:
    """llama-server's streams end with the connection closed while its headers say keep-alive; the close can arrive
    after the next request went out on it: that request is sent again on a new connection, not counted an error."""
    with fake_server(model="fake", ttft_ms=2, itl_ms=1, fault="close") as url:
        r = _measure(url, concurrency=2)
    assert r.metrics["error_count"] == 0 and r.metrics["requests_per_s"] > 0
    assert r.metrics["mean_output_tokens"] == OUT


def test_wrong_model_unreachable_and_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key of an endpoint job comes from the operator's credential (FARM_ENDPOINT_CREDENTIALS), named by the
    request; a server farm started (no authority: not an endpoint) never gets it."""
    monkeypatch.setenv("TEST_LLM_KEY", "s3cret")
    monkeypatch.setenv("FARM_ENDPOINT_CREDENTIALS", "fake-key=env:TEST_LLM_KEY")
    reset_settings()
    with fake_server(model="fake", api_key="s3cret") as url:
        hostport = url.split("//")[1]
        with pytest.raises(LoadGenError, match="401.*--credential"):
            _measure(url, authority=hostport)
        with pytest.raises(LoadGenError, match="does not serve model 'nope'.*fake"):
            _measure(url, model="nope", credential="fake-key", authority=hostport)
        assert _measure(url, credential="fake-key", authority=hostport).metrics["error_count"] == 0
        with pytest.raises(LoadGenError, match="401"):  # a launched server's job: no operator secret sent
            _measure(url, credential="fake-key")
        with pytest.raises(LoadGenError, match="credential 'other' is not set up on this worker") as err:
            _measure(url, credential="other", authority=hostport)
        assert "s3cret" not in str(err.value)
    with pytest.raises(LoadGenError, match="cannot reach"):
        _measure(url)


def _word_tokenizer(path: Path) -> Path:
    from workers.loadgen.openai.workload import WORDS

    return word_tokenizer(path, tuple(WORDS))


def test_prompts_exact_with_a_tokenizer_and_from_files(tmp_path: Path) -> None:
    tok = Tokenizer(str(_word_tokenizer(tmp_path)))
    llm = LlmSettings(input_tokens="20:40", prefix_tokens=5, seed=3)
    prompts = synthetic_prompts(llm, tok, 20)
    salts = Salts.of(tok).started()
    # exact with any request's salt in place: the salt's words are one token each
    assert all(tok.count(p.salted(salts.salt(k))) + tok.specials() == p.input_tokens
               for k, p in enumerate(prompts)) and {p.input_source for p in prompts} == {"tokenizer"}
    assert all(25 <= p.input_tokens <= 45 for p in prompts)
    assert len({p.text.split()[0:5].__str__() for p in prompts}) == 1  # the shared prefix
    # the salt right after the prefix: two requests of one prompt differ from the prefix's end on
    a, b = (prompts[0].salted(salts.salt(k)).split() for k in (1, 2))
    assert a[:5] == b[:5] and a[5:9] != b[5:9] and a[9:] == b[9:]
    assert [p.text for p in synthetic_prompts(llm, tok, 20)] == [p.text for p in prompts]  # same seed, same prompts
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "hello there", "output_tokens": 7}\n\n{"text": "x y z"}\n')
    got = file_prompts(LlmSettings(prompts=str(jsonl), output_tokens=9), jsonl, None)
    salt = SALT_WORDS  # each file prompt is salted at its start, its words counted
    assert [(p.text, p.max_tokens, p.input_tokens) for p in got] == [("hello there", 7, 2 + salt),
                                                                     ("x y z", 9, 3 + salt)]
    assert got[0].salted(salts.salt(0)).endswith(" hello there") and got[0].salt_at == 0
    share = tmp_path / "sg.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi you"},
                                                    {"from": "gpt", "value": "hello"}]}]))
    assert file_prompts(LlmSettings(prompts=str(share)), share, tok)[0].text == "hi you"
    jsonl.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(RequestError, match="line 2 is not JSON"):
        file_prompts(LlmSettings(prompts=str(jsonl)), jsonl, None)
    jsonl.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    with pytest.raises(RequestError, match="item 2 has no prompt text"):
        file_prompts(LlmSettings(prompts=str(jsonl)), jsonl, None)
    with pytest.raises(RequestError, match="no such file"):
        Tokenizer(str(tmp_path / "missing"))


@pytest.mark.skipif(jail_unavailable() is not None, reason=str(jail_unavailable()))
def test_tokenizer_counts_output_without_usage(tmp_path: Path, sqlite_url: str) -> None:
    """The request's tokenizer, uploaded with it, counts the chunks in the jail (a few round trips a run)."""
    ref = stored("tokenizer", _word_tokenizer(tmp_path))
    with fake_server(model="fake", ttft_ms=2, itl_ms=1, per_chunk=2, fault="no_usage") as url:
        r = _measure(url, concurrency=2, tokenizer=ref.model_dump())
    assert r.metrics["mean_output_tokens"] == OUT and r.details["token_sources"]["output"].keys() == {"tokenizer"}
    assert r.details["tokens_per_chunk_mean"] == 2.0


def _search_step(url: str, rate: float) -> LoadResult:
    """One max-goodput search step (its over-saturation stop on) at ``rate``, 4 s measured."""
    settings = MeasurementSettings(duration_s=4.0, warmup_s=0.5, window_s=1.0, rate=rate, search="max-goodput",
                                   llm={"api": "openai-chat", "input_tokens": 16, "output_tokens": 8,
                                        "slo": "ttft=150"})
    return run_load(LoadTarget(url.split("//")[1], "fake"), LoadSpec.from_settings([], 1, 1, settings))


def test_an_oversaturated_search_step_is_stopped_early_and_flagged() -> None:
    """One slot of 20 + 7 x 5 ms: at most 18 requests/s. At 60/s the queue grows by 40/s and TTFT climbs: the
    step stops before its 4 windows end, flagged, its cut-off requests against the SLO; at 4/s it runs on."""
    with fake_server(model="fake", ttft_ms=20, itl_ms=5, slots=1) as url:
        over, calm = _search_step(url, 60.0), _search_step(url, 4.0)
    d = over.details
    assert d["oversaturated"] and d["oversaturated_why"].startswith("over-saturated: requests in flight grew")
    assert any("stopped early" in n for n in d["notes"]) and d["slo_met_share"] < 0.5
    assert over.metrics["duration_s"] < 4.0 and len(d["windows"]) < 4  # cut at the stop, not the plan's end
    assert not calm.details["oversaturated"] and calm.details["oversaturated_why"] is None
    assert calm.metrics["duration_s"] == pytest.approx(4.0) and calm.details["slo_met_share"] is not None

"""SSE parsing, chunk accounting, token truth and goodput of the OpenAI client (workers.loadgen.openai.stream,
openai_client.llm_metrics), on scripted byte lines: no server, no clock."""
from __future__ import annotations

import json

import pytest

from schemas.llm import Slo
from workers.loadgen.openai.client import llm_metrics, tokens_in
from workers.loadgen.openai.load_loop import HttpRun
from workers.loadgen.openai.stream import (
    MALFORMED_SSE,
    NO_TOKENS,
    STREAM_ERROR,
    TRUNCATED,
    RawRequest,
    account,
    chunk_tokens,
    close_stream,
    feed_line,
    itl_values,
    replay,
)


def _rec(max_tokens: int = 8) -> RawRequest:
    return RawRequest(scheduled=10.0, sent=10.0, warm=False, prompt_tokens=5, prompt_source="words",
                      max_tokens=max_tokens)


def _data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n"


def _chat(text: str, usage: dict[str, int] | None = None) -> bytes:
    return _data({"choices": [{"index": 0, "delta": {"content": text}}], **({"usage": usage} if usage else {})})


def _feed(rec: RawRequest, lines: list[tuple[float, bytes]]) -> None:
    for t, line in lines:
        if feed_line(rec, line, t):
            break
    close_stream(rec, lines[-1][0])


def test_chat_stream_with_final_usage() -> None:
    rec = _rec()
    _feed(rec, [(10.001, _data({"choices": [{"delta": {"role": "assistant", "content": ""}}]})),  # role only
                (10.020, _chat(" a")), (10.025, b": keep-alive comment\n"), (10.030, _chat(" b")),
                (10.040, _chat(" c")), (10.041, b"\n"),
                (10.042, _data({"choices": [{"delta": {}, "finish_reason": "length"}]})),
                (10.043, _data({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}})),
                (10.044, b"data: [DONE]\n")])
    assert rec.error is None and rec.done and rec.finish_reason == "length"
    o = account(rec, None)
    assert o.ttft_ms == pytest.approx(20.0)  # the first chunk with text, not the role chunk
    assert o.e2e_ms == pytest.approx(44.0)
    assert (o.output_tokens, o.output_source, o.input_tokens, o.input_source) == (3, "usage", 9, "usage")
    assert o.itl_ms == pytest.approx([10.0, 10.0])
    assert o.tpot_ms == pytest.approx((44.0 - 20.0) / 2)
    assert not o.overrun and o.chunks == 3


def test_chunk_of_k_tokens_counts_k_intervals() -> None:
    """Two chunks: 1 token, then 4 tokens 20 ms later: four ITL values of 5 ms (not one of 20 ms)."""
    assert itl_values([1.0, 1.020], [1, 4]) == pytest.approx([5.0] * 4)
    rec = _rec()
    _feed(rec, [(10.01, _chat("x", {"completion_tokens": 1})), (10.03, _chat("yyyy", {"completion_tokens": 5})),
                (10.04, b"data: [DONE]\n")])
    counts, total, source = chunk_tokens(rec, None)
    assert (counts, total, source) == ([1, 4], 5, "usage")  # cumulative per-chunk usage


def test_final_usage_spread_over_chunks_by_tokenizer_weight() -> None:
    rec = _rec(max_tokens=4)
    _feed(rec, [(10.01, _chat("one")), (10.02, _chat("two three four five")),
                (10.03, _data({"choices": [], "usage": {"completion_tokens": 6}})), (10.04, b"data: [DONE]\n")])
    counts, total, source = chunk_tokens(rec, lambda text: len(text.split()))
    assert (sum(counts), total, source) == (6, 6, "usage") and counts[1] > counts[0]
    assert account(rec, None).overrun  # 6 generated, 4 asked for


def test_without_usage_the_tokenizer_then_the_chunks_count() -> None:
    rec = _rec()
    _feed(rec, [(10.01, _chat("a b")), (10.02, _chat(" c")), (10.03, _data({"choices": [{"finish_reason": "stop"}]}))])
    assert rec.error is None  # a finish reason without [DONE] is a complete stream
    assert chunk_tokens(rec, lambda t: len(t.split()))[1:] == (3, "tokenizer")
    assert chunk_tokens(rec, None) == ([1, 1], 2, "chunks")


def test_completions_text_and_llama_cpp_timings() -> None:
    rec = _rec()
    _feed(rec, [(10.01, _data({"choices": [{"text": "hi"}]})),
                (10.02, _data({"choices": [{"text": "", "finish_reason": "length"}],
                               "timings": {"prompt_ms": 3.5, "predicted_per_token_ms": 1.25}})),
                (10.03, b"data: [DONE]\n")])
    o = account(rec, None)
    assert (o.server_ttft_ms, o.server_tpot_ms, o.output_tokens) == (3.5, 1.25, 1) and o.tpot_ms is None


@pytest.mark.parametrize(("lines", "error"), [
    ([_chat("a"), b"data: {not json\n"], MALFORMED_SSE),
    ([b"data: [1, 2]\n"], MALFORMED_SSE),
    ([_chat("a"), _data({"error": {"message": "overloaded"}})], STREAM_ERROR),
    ([_chat("a"), _chat("b")], TRUNCATED),  # the connection closed without [DONE] or a finish reason
    ([b"data: [DONE]\n"], NO_TOKENS),
])
def test_broken_streams_are_counted_errors(lines: list[bytes], error: str) -> None:
    rec = _rec()
    _feed(rec, [(10.0 + i / 100, line) for i, line in enumerate(lines)])
    assert rec.error == error and rec.error_text and rec.error_text.startswith(error)


def test_goodput_and_token_rates() -> None:
    outs = []
    for ttft_s in (0.05, 0.30):  # one within the TTFT goal, one not
        rec = _rec(max_tokens=4)
        _feed(rec, [(10 + ttft_s, _chat("a")), (10 + ttft_s + 0.01, _chat("b")),
                    (10 + ttft_s + 0.02, _data({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}})),
                    (10 + ttft_s + 0.02, b"data: [DONE]\n")])
        outs.append(account(rec, None))
    m = llm_metrics(outs, 2.0, Slo(ttft_ms=100))
    assert m["goodput_req_per_s"] == pytest.approx(0.5)
    assert (m["output_tokens_per_s"], m["input_tokens_per_s"], m["mean_output_tokens"]) == (2.0, 7.0, 2.0)
    assert m["ttft_p50_ms"] == pytest.approx(175.0) and m["itl_p50_ms"] == pytest.approx(10.0)
    assert m["output_overrun_count"] == 0 and llm_metrics(outs, 2.0, None)["goodput_req_per_s"] is None


def test_replay_stamps_each_line_with_the_read_that_completed_it() -> None:
    """The load loop keeps raw reads; an event split over two reads takes the second read's time."""
    rec = _rec()
    rec.pieces = [(10.01, b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[{"delta":'),
                  (10.03, b'{"content":"b"}}]}\n\n'), (10.05, b"data: [DONE]\n\n")]
    rec.eof = 10.06
    replay(rec)
    assert rec.chunk_t == [10.01, 10.03] and rec.chunk_text == ["a", "b"] and rec.done and rec.end == 10.05
    assert rec.error is None and rec.pieces == []
    cut = _rec()
    cut.pieces, cut.eof = [(10.01, _chat("a"))], 10.02
    replay(cut)
    assert cut.error == TRUNCATED and cut.end == 10.02


def test_histogram_p50_of_the_difference_between_scrapes() -> None:
    from workers.loadgen.openai.server_metrics import Scrape, bucket_quantile, server_p50s

    assert bucket_quantile({0.01: 0.0, 0.02: 10.0, float("inf"): 10.0}, 0.5) == pytest.approx(0.015)
    before = Scrape({"vllm:time_to_first_token_seconds": {0.01: 100.0, 0.02: 100.0, float("inf"): 100.0}})
    after = Scrape({"vllm:time_to_first_token_seconds": {0.01: 100.0, 0.02: 110.0, float("inf"): 110.0}})
    assert server_p50s(before, after) == {"ttft": pytest.approx(15.0)}  # the 10 new requests only
    assert server_p50s(None, None) == {}


def test_vllms_queue_and_prefill_histograms_give_their_p50s_and_each_figure_has_its_column() -> None:
    """vLLM's request_queue_time_seconds and request_prefill_time_seconds (the reports' TTFT split) give the
    ``queue`` and ``prefill`` p50s (ms), stored as ``server_<figure>_p50_ms``: a registered metric for each figure."""
    from schemas.metrics import BY_NAME
    from workers.loadgen.openai.server_metrics import FAMILIES, Scrape, server_p50s

    inf = float("inf")
    after = Scrape({"vllm:request_queue_time_seconds": {0.001: 4.0, 0.005: 10.0, inf: 10.0},
                    "vllm:request_prefill_time_seconds": {0.01: 0.0, 0.03: 10.0, inf: 10.0}})
    got = server_p50s(None, after)
    assert got == {"queue": pytest.approx(0.001e3 + 4.0 * (1 / 6)), "prefill": pytest.approx(20.0)}
    assert all(f"server_{figure}_p50_ms" in BY_NAME for figure in FAMILIES)


def test_output_tokens_count_by_their_arrival_in_the_window() -> None:
    """A request that started before the window counts only the tokens that arrived in it; one cut off by the
    stop counts its chunks at the complete requests' mean tokens per chunk (it has no final usage)."""
    def stream(t0: float, n: int, usage: bool) -> RawRequest:
        rec = _rec(max_tokens=2 * n)
        lines = [(t0 + i, _chat("a b")) for i in range(n)]
        if usage:
            lines += [(t0 + n, _data({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2 * n}})),
                      (t0 + n, b"data: [DONE]\n")]
        _feed(rec, lines)
        return rec

    done, cut = stream(8.0, 4, True), stream(11.0, 3, False)  # chunks at 8..11 (2 tokens each); at 11..13
    run = HttpRun(records=[done], cut=[cut])
    outs = [account(done, None)]
    assert tokens_in(run, [(10.0, 12.0), (12.0, 14.0)], None, outs) == 2 * 2 + 3 * 2  # 10, 11 | 11, 12, 13
    m = llm_metrics(outs, 4.0, None, tokens_in(run, [(10.0, 14.0)], None, outs))
    assert m["output_tokens_per_s"] == 10 / 4 and m["mean_output_tokens"] == 8

"""One event log per LLM request (``farm.llm_events``, built by ``workers.loadgen.openai.event_log``): a request of
known timing through the recorder, each tool's TTFT/ITL/TPOT against a hand computation, and the cap."""
from __future__ import annotations

import pytest

from farm.llm_events import IN_FLIGHT, EventLog, chunk_gaps, measured, request_figures, tool_summary
from workers.loadgen.openai.event_log import event_log, recorded
from workers.loadgen.openai.load_loop import HttpRun
from workers.loadgen.openai.stream import RawRequest

T0 = 100.0  # the run's start, monotonic s


def _request(seq: int, at: float, kinds: list[str], per_chunk: int = 2, warm: bool = False) -> RawRequest:
    """A complete request scheduled ``at`` s into the run, sent 1 ms later, its head 5 ms after that, its first
    chunk 20 ms after the send and one chunk every 10 ms, ``per_chunk`` tokens each (cumulative usage per chunk), the
    end 3 ms after the last chunk."""
    rec = RawRequest(scheduled=T0 + at, sent=T0 + at + 0.001, warm=warm, prompt_tokens=16, prompt_source="words",
                     max_tokens=64, seq=seq, wrote=T0 + at + 0.001, first_byte=T0 + at + 0.006)
    rec.chunk_t = [T0 + at + 0.021 + 0.010 * j for j in range(len(kinds))]
    rec.chunk_text = ["a b"] * len(kinds)
    rec.chunk_kind = kinds
    rec.chunk_usage = [per_chunk * (j + 1) for j in range(len(kinds))]
    rec.end, rec.done = rec.chunk_t[-1] + 0.003, True
    rec.usage = {"completion_tokens": per_chunk * len(kinds), "prompt_tokens": 16}
    return rec


def _run() -> HttpRun:
    kinds = ["reasoning", "reasoning", "content", "content", "tool"]
    failed = _request(3, 0.2, ["content"])
    failed.fail("HTTP_500", "HTTP 500: boom", T0 + 0.25)
    cut = _request(4, 0.3, ["content", "content"])
    return HttpRun(records=[_request(2, 0.1, kinds), _request(1, 0.0, kinds, warm=True), failed], cut=[cut],
                   t_start=T0)


def test_the_recorder_keeps_every_event_of_every_request() -> None:
    log = event_log(_run(), None)
    assert log.seq == [1, 2, 3, 4] and log.warm == [True, False, False, False]
    assert log.error == [None, None, "HTTP_500", IN_FLIGHT]
    assert log.chunks == [5, 5, 1, 2] and log.kept == log.chunks and len(log.chunk_us) == 13
    assert log.chunk_kind[:5] == "rrcct" and log.chunk_tokens[:5] == [2] * 5
    assert log.output_tokens[:2] == [10, 10] and log.reasoning_tokens[:2] == [4, 4]
    # µs from the run's start: request 2 scheduled at 100 ms, written at 101, head at 106, chunks from 121
    assert (log.scheduled_us[1], log.sent_us[1], log.first_byte_us[1]) == (100_000, 101_000, 106_000)
    assert log.first_chunk_us[1] == 121_000 and log.first_output_us[1] == 141_000
    assert log.last_chunk_us[1] == 161_000 and log.end_us[1] == 164_000
    assert measured(log) == [1]  # not the warm-up, not the failed one, not the one cut off


def test_each_tools_figures_match_a_hand_computation() -> None:
    log = event_log(_run(), None)
    f = request_figures(log, 1)  # 5 chunks of 2 tokens: N = 10, first chunk 20 ms after the send
    assert f["ttft_ms_farm"] == pytest.approx(21.0)  # from the scheduled send
    assert f["ttft_ms_vllm"] == f["ttft_ms_aiperf"] == f["ttft_ms_guidellm"] == pytest.approx(20.0)
    assert f["ttfot_ms_farm"] == pytest.approx(41.0) and f["ttfo_ms_aiperf"] == pytest.approx(40.0)
    # vLLM's TPOT and AIPerf's and GuideLLM's ITL: (last chunk - first chunk) / (N - 1) = 40 / 9
    assert f["tpot_ms_vllm"] == f["itl_ms_aiperf"] == f["itl_ms_guidellm"] == pytest.approx(40 / 9)
    # farm's TPOT runs to the end (3 ms after the last chunk): 43 / 9; GuideLLM's TPOT includes TTFT: 60 / 10
    assert f["tpot_ms_farm"] == pytest.approx(43 / 9) and f["tpot_ms_guidellm"] == pytest.approx(6.0)
    assert f["e2e_ms_farm"] == pytest.approx(64.0) and f["e2el_ms_vllm"] == pytest.approx(60.0)
    gaps, per_token = chunk_gaps(log, [1])
    assert gaps == pytest.approx([10.0] * 4)  # vLLM's ITL, AIPerf's ICL: one a chunk gap
    assert per_token == pytest.approx([5.0] * 8)  # farm's: a 10 ms gap before 2 tokens is 2 intervals of 5 ms
    by = {(s.figure, s.tool): s for s in tool_summary(log)}
    assert by[("itl", "vllm")].p50 == pytest.approx(10.0) and by[("itl", "vllm")].over == "chunk gaps"
    assert by[("itl", "farm")].p50 == pytest.approx(5.0) and by[("itl", "farm")].n == 8
    assert by[("tpot", "guidellm")].p50 == pytest.approx(6.0) and by[("ttft", "farm")].n == 1


def test_the_cap_keeps_whole_requests_and_flags_the_log() -> None:
    log, tools = recorded(_run(), None, max_chunks=6)
    assert log.cut and log.max_chunks == 6
    assert log.kept == [5, 0, 1, 0] and len(log.chunk_us) == len(log.chunk_tokens) == len(log.chunk_kind) == 6
    assert log.first_chunk_us[1] == 121_000  # a request past the cap keeps its own times: its figures stay exact
    assert request_figures(log, 1)["tpot_ms_vllm"] == pytest.approx(40 / 9)
    assert {(t.figure, t.tool): t.n for t in tools}[("itl", "vllm")] == 4  # the summary is the uncapped log's
    assert not event_log(_run(), None).capped(100).cut


def test_a_stored_log_reads_back_and_an_unknown_one_is_none() -> None:
    from dataclasses import asdict

    log = event_log(_run(), None)
    assert EventLog.of(asdict(log)) == log
    assert EventLog.of({"version": 99}) is None and EventLog.of(None) is None


def test_the_request_cap_keeps_the_first_requests_and_the_figures_of_all() -> None:
    log, tools = recorded(_run(), None, max_chunks=100, max_requests=2)
    assert log.seq == [1, 2] and log.requests_total == 4 and log.cut
    assert log.kept == [5, 5] and len(log.chunk_us) == 10 and log.chunk_kind == "rrcct" * 2
    assert all(len(getattr(log, name)) == 2 for name in ("warm", "sent_us", "end_us", "error", "output_tokens"))
    assert {(t.figure, t.tool): t.n for t in tools}[("ttft", "vllm")] == 1

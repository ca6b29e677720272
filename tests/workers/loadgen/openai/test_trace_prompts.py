"""Prompts of a trace replay from its hash ids (``trace_prompts``): equal ids give identical blocks, different ids
and rows without ids differ, lengths are the rows' (by a tokenizer where the tokenizers library is installed, else
by the words built), and the replay's pattern gets the trace's schedule."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm import traces
from schemas.llm import LlmSettings
from workers.loadgen.openai.trace_prompts import Builder, trace_prompts
from workers.loadgen.openai.workload import WORDS, Counting, Tokenizer
from workers.loadgen.patterns import ConstantRate, TraceReplay

ROWS = [traces.TraceRow(1, 0, 16, 3, (1, 2)), traces.TraceRow(2, 10, 16, 4, (1, 3)),
        traces.TraceRow(3, 20, 20, 5, (1, 2, 4)), traces.TraceRow(4, 30, 12, 6), traces.TraceRow(5, 40, 12, 7)]


def _tokenizer(tmp_path: Path) -> Counting:
    pytest.importorskip("tokenizers")
    from tests.fake_openai import word_tokenizer  # noqa: PLC0415 - needs the tokenizers library
    return Tokenizer(str(word_tokenizer(tmp_path, WORDS)))


@pytest.fixture(params=["words", "tokenizer"])
def tok(request: pytest.FixtureRequest, tmp_path: Path) -> Counting | None:
    return _tokenizer(tmp_path) if request.param == "tokenizer" else None


def _count(text: str, tok: Counting | None) -> int:
    return tok.count(text) if tok is not None else len(text.split())


def test_equal_hash_ids_give_identical_blocks_and_different_ones_differ(tok: Counting | None) -> None:
    build = Builder(block_tokens=8, seed=0, tok=tok)
    a, b, c, d, e = (build.blocks(r) for r in ROWS)
    assert a[0] == b[0] == c[0] and a[1] == c[1]  # ids 1 and 2 shared
    assert a[1] != b[1] and len({a[0], a[1], b[1], c[1]}) == 3  # ids 2 and 3 differ
    assert [len(x) for x in (a, b, c, d, e)] == [2, 2, 3, 2, 2]
    assert _count(c[2], tok) == 4 and build.blocks(traces.TraceRow(9, 0, 8, 1, (4,)))[0].startswith(c[2])
    assert all(block.startswith(" ") for block in a + b + c + d + e)  # each led by the space that joins it
    assert set(d).isdisjoint(e) and set(d).isdisjoint(a + b + c)  # rows without ids: their own content
    assert Builder(8, 1, tok).blocks(ROWS[0])[0] != a[0]  # another seed, other text


def test_a_prompt_holds_its_row_s_tokens_and_shares_exactly_the_trace_s_prefix(tok: Counting | None) -> None:
    build = Builder(block_tokens=8, seed=0, tok=tok)
    a, b, c, *_ = prompts = [build.prompt(r) for r in ROWS]
    for p, row in zip(prompts, ROWS, strict=True):
        assert p.input_tokens == _count(p.text, tok) == row.input_tokens and p.max_tokens == row.output_tokens
        assert p.input_source == ("tokenizer" if tok is not None else "words")
    assert c.text.startswith(a.text + " ")  # ids 1, 2 then 4: a's whole prompt is c's prefix
    shared = build.blocks(ROWS[0])[0]
    assert b.text.startswith(shared + " ") and not b.text.startswith(a.text)
    if tok is not None:  # by the tokenizer: the first 16 tokens of c are a's
        assert tok.cut(c.text, 16).strip() == a.text.strip() and tok.cut(b.text, 8) == tok.cut(a.text, 8)


def test_blocks_begin_at_whole_blocks_of_tokens_by_a_byte_level_bpe(tmp_path: Path) -> None:
    """Finding: blocks cut alone and joined by a space drifted by a token here and there in context (32, 65, 96,
    129 ... with the tiny-llama example's byte-level BPE), so a server's prefix cache, which reuses whole blocks,
    missed blocks the trace shares, and prompts were a token off their rows' lengths. Cut in context (each block
    led by its joining space), block j begins at token 32 j and every prompt holds its row's tokens exactly."""
    pytest.importorskip("tokenizers")
    from farm.models.llm_examples import train_tokenizer  # noqa: PLC0415 - needs the llm extra's tokenizers

    train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(str(tmp_path / "tokenizer.json"))
    build = Builder(block_tokens=32, seed=3, tok=tok)
    for k in range(1, 9):
        row = traces.TraceRow(k, 10 * k, 32 * k + 7, 4, tuple(range(1, k + 1)))
        blocks = build.blocks(row)
        assert [tok.count("".join(blocks[:j])) for j in range(1, len(blocks))] == [32 * j for j in range(1, k + 1)]
        assert build.prompt(row).input_tokens == tok.count("".join(blocks)) == row.input_tokens


def test_a_trace_file_becomes_prompts_in_its_order(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": r.t_ms, "input_length": r.input_tokens * 32,
                                        "output_length": r.output_tokens * 32, "hash_ids": list(r.hash_ids)}) + "\n"
                            for r in ROWS))
    llm = LlmSettings(trace=str(path), trace_tokens=1 / 32, trace_limit=4)
    prompts = trace_prompts(llm, path, None)
    assert [(p.input_tokens, p.max_tokens) for p in prompts] == [(r.input_tokens, r.output_tokens) for r in ROWS[:4]]
    assert prompts[2].text.startswith(prompts[0].text)  # 16-token blocks at 1/32: row 3 starts with row 1


def test_the_replay_pattern_sends_on_the_schedule_then_stops() -> None:
    pattern = TraceReplay(4.0).with_offsets((0.0, 0.25, 0.25, 1.0))
    assert isinstance(pattern, ConstantRate) and pattern.split(4) == [pattern] and pattern.max_processes(8) == 1
    assert list(pattern.send_times(10.0, seed=0)) == [10.0, 10.25, 10.25, 11.0]
    assert pattern.late_pct(4, 1) == 25.0  # late sends are counted (the row's client-limited flag)
    with pytest.raises(ValueError, match="without its schedule"):
        TraceReplay(4.0).send_times(0.0, seed=0)


def test_a_trace_is_cut_by_the_server_s_tokenizer_where_it_has_one(tmp_path: Path) -> None:
    from workers.loadgen.openai.jailed_workload import open_workload  # noqa: PLC0415 - the job's workload

    server = _tokenizer(tmp_path)
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": r.t_ms, "input_length": r.input_tokens,
                                        "output_length": r.output_tokens, "hash_ids": list(r.hash_ids)}) + "\n"
                            for r in ROWS))
    llm = LlmSettings(trace=str(path))
    with open_workload(llm, submitting=True, server=server) as (prompts, tok):
        assert tok is None  # no --tokenizer: the server's own one cut the blocks
        assert [p.input_source for p in prompts] == ["tokenizer"] * len(ROWS)
        assert [p.input_tokens for p in prompts] == [server.count(p.text) for p in prompts] == \
            [r.input_tokens for r in ROWS]

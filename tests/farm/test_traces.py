"""``farm.traces``: the three trace formats read from small files written here, bad ones as one-line errors naming
their line, and the schedule (speed, limit, token scale) as pure functions."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm import traces
from farm.errors import RequestError

MOONCAKE = [{"timestamp": 0, "input_length": 1024, "output_length": 64, "hash_ids": [1, 2]},
            {"timestamp": 200, "input_length": 700, "output_length": 96, "hash_ids": [1, 3]},
            {"timestamp": 250, "input_length": 300, "output_length": 64},
            {"timestamp": 700, "input_length": 1500, "output_length": 128, "hash_ids": [1, 2, 4]}]
BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,ChatGPT,1087,320,1407,Conversation log\n"
            "118.5,GPT-4,417,276,693,API log\n")
AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:50.9951690,396,109\n"
         "2023-11-16 18:15:51.2000000,879,7\n")


def _jsonl(path: Path, items: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def test_a_mooncake_trace_is_read_with_its_hash_ids(tmp_path: Path) -> None:
    trace = traces.read(_jsonl(tmp_path / "m.jsonl", MOONCAKE), "m.jsonl")
    assert trace.format == "mooncake" and trace.block_tokens == traces.BLOCK_TOKENS
    assert [(r.line, r.t_ms, r.input_tokens, r.output_tokens, r.hash_ids) for r in trace.rows] == [
        (i + 1, m["timestamp"], m["input_length"], m["output_length"], tuple(m.get("hash_ids", [])))  # type: ignore[arg-type]
        for i, m in enumerate(MOONCAKE)]
    assert trace.offsets_s() == (0.0, 0.2, 0.25, 0.7)


def test_a_burstgpt_trace_is_read_in_seconds_from_its_first_row(tmp_path: Path) -> None:
    (tmp_path / "b.csv").write_text(BURSTGPT)
    trace = traces.read(tmp_path / "b.csv", "b.csv")
    assert trace.format == "burstgpt"
    assert [(r.input_tokens, r.output_tokens, r.hash_ids) for r in trace.rows] == [(472, 18, ()), (1087, 320, ()),
                                                                                   (417, 276, ())]
    assert trace.offsets_s() == pytest.approx((0.0, 40.0, 113.5))


def test_an_azure_trace_is_read_from_its_dates(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text(AZURE)
    trace = traces.read(tmp_path / "a.csv", "a.csv")
    assert trace.format == "azure"
    assert [(r.input_tokens, r.output_tokens) for r in trace.rows] == [(374, 44), (396, 109), (879, 7)]
    assert trace.offsets_s() == pytest.approx((0.0, 4.314579, 4.519410), abs=1e-6)


def test_speed_limit_and_token_scale_shape_the_schedule(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "m.jsonl", MOONCAKE)
    fast = traces.read(path, "m", tokens=1 / 16, limit=3)
    assert len(fast.rows) == 3 and fast.block_tokens == 32
    assert [r.input_tokens for r in fast.rows] == [64, 44, 19] and [r.output_tokens for r in fast.rows] == [4, 6, 4]
    assert fast.offsets_s(speed=2.0) == (0.0, 0.1, 0.125)
    assert fast.rate(speed=2.0) == pytest.approx(2 / 0.125)
    assert traces.schedule([1000.0, 1000.0, 3000.0], 0.5) == (0.0, 0.0, 4.0)
    assert traces.scale_tokens(3, 0.01) == 1  # never below one token


@pytest.mark.parametrize(("content", "line", "text"), [
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "session": 3}\n', 1, "unknown key 'session'"),
    ('{"timestamp": 10, "input_length": 5, "output_length": 1}\n{"timestamp": 5, "input_length": 5, '
     '"output_length": 1}\n', 2, "sort the trace by time"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1}\n', 1, "negative"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1}\n', 1, "input_length"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, -2]}\n', 1, "hash_ids"),
    ('{"timestamp": 0, "input_length": 5}\n', 1, "no 'output_length'"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\nnot json\n', 2, "not JSON"),
    ("Timestamp,Request tokens,Response tokens,User\n1,2,3,x\n", 1, "unknown column 'User'"),
    ("Timestamp,Request tokens,Response tokens\n1,2,3\n0.5,2,3\n", 3, "sort the trace by time"),
    ("Timestamp,Request tokens,Response tokens\n-1,2,3\n", 2, "negative"),
    ("Timestamp,Request tokens,Response tokens\n1,2,0\n", 2, "Response tokens"),
    ("Timestamp,Request tokens\n1,2\n", 1, "no 'Response tokens' column"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n2023-11-16 18:15:45,3,4\n", 3,
     "sort the trace by time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", 2, "not a date"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n", 1, "unknown column 'Extra'"),
])
def test_a_bad_trace_is_one_line_naming_its_line(tmp_path: Path, content: str, line: int, text: str) -> None:
    path = tmp_path / "bad.trace"
    path.write_text(content)
    with pytest.raises(RequestError) as err:
        traces.read(path, "bad.trace")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"--trace bad.trace: line {line}: ") and text in message


def test_an_empty_or_oversized_trace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(RequestError, match="holds no request"):
        traces.read(tmp_path / "e.jsonl", "e.jsonl")
    path = _jsonl(tmp_path / "m.jsonl", MOONCAKE)
    with pytest.raises(RequestError, match="FARM_MAX_WORKLOAD_FILE_BYTES"):
        traces.read(path, "m.jsonl", max_bytes=path.stat().st_size - 1)


def test_lengths_over_the_context_after_scaling_name_the_line(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "m.jsonl", MOONCAKE)
    traces.check(traces.read(path, "m", tokens=0.5), "m", context=814, max_prompt_tokens=4096, tokens=0.5)
    with pytest.raises(RequestError) as err:
        traces.check(traces.read(path, "m", tokens=0.5), "m", context=813, max_prompt_tokens=4096, tokens=0.5)
    assert str(err.value).startswith("--trace m: line 4: input 750 + output 64 tokens after --trace-tokens 0.5")
    with pytest.raises(RequestError, match="line 4: a prompt of 1500 tokens is above the 1024"):
        traces.check(traces.read(path, "m"), "m", context=None, max_prompt_tokens=1024, tokens=1.0)

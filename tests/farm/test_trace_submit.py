"""``farm submit --trace FILE --endpoint URL --api ...`` end to end on the embedded path against the fake OpenAI
server: the requests arrive in the trace's order with its gaps (generous bounds: no timing asserted tightly) and
ask for its lengths; a trace faster than the client can send is flagged client-limited; bad traces are one-line
usage errors naming their line, before any job."""
from __future__ import annotations

import json
from pathlib import Path

from schemas.result import CLIENT_LIMITED_PCT, client_limited
from tests.fake_openai import fake_server, read_log
from tests.helpers import assert_refused, farm, farm_env
from workers.loadgen.openai.load_loop import request_seq

#: (ms, input tokens, output tokens, hash ids): replayed at token scale 1/32 (16-token blocks)
ROWS = [(0, 1024, 64, [1, 2]), (400, 700, 96, [1, 3]), (450, 300, 64, []), (1200, 1500, 128, [1, 2, 4]),
        (1500, 512, 32, [5])]
SCALE = ["--trace-tokens", "0.03125"]


def _mooncake(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                            for t, i, o, h in rows))
    return path


def _rows(rid: str, env: dict[str, str]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    return rows


def test_a_trace_is_replayed_on_its_schedule_with_its_lengths(tmp_path: Path) -> None:
    trace, log, env = _mooncake(tmp_path / "m.jsonl", ROWS), tmp_path / "server.log", farm_env()
    with fake_server(log=log, model="tiny", ttft_ms=5, itl_ms=1) as url:
        out = farm("submit", "--endpoint", url, "--api", "openai-completions", "--model-name", "tiny",
                   "--trace", str(trace), *SCALE, "--json", env=env)
    got = sorted(read_log(log), key=lambda r: request_seq(r["rid"]))
    assert len(got) == len(ROWS) and all(r["done"] for r in got)
    recv = [r["recv"] for r in got]
    assert recv == sorted(recv)  # sent in the trace's order
    for (t_ms, *_), at in zip(ROWS, recv, strict=True):  # its gaps, within a generous 250 ms
        assert abs((at - recv[0]) - t_ms / 1e3) < 0.25, (recv, ROWS)
    assert [r["n"] for r in got] == [round(o / 32) for _, _, o, _ in ROWS]  # the output lengths asked for
    (row,) = _rows(json.loads(out.stdout)["request_id"], env)
    assert row["status"] == "succeeded" and row["input_tokens"] is None
    assert str(row["prompts"]).startswith(f"trace {trace} (sha256 ") and "tokens x0.03125" in str(row["prompts"])
    want_in = [round(i / 32) for _, i, _, _ in ROWS]  # the fake counts words: a word is a token without a tokenizer
    assert row["mean_input_tokens"] == sum(want_in) / len(ROWS)
    assert row["mean_output_tokens"] == sum(r["n"] for r in got) / len(ROWS)
    assert row["rate"] == (len(ROWS) - 1) / 1.5  # the trace's mean rate, recorded


def test_a_trace_faster_than_the_client_is_flagged_client_limited(tmp_path: Path) -> None:
    rows = [(0, 512, 32, [])] * 300 + [(1000, 512, 32, [])]  # 300 sends at once: no client sends them on time
    trace, env = _mooncake(tmp_path / "burst.jsonl", rows), farm_env()
    with fake_server(model="tiny", ttft_ms=1, itl_ms=1) as url:
        out = farm("submit", "--endpoint", url, "--api", "openai-completions", "--model-name", "tiny",
                   "--trace", str(trace), *SCALE, "--json", env=env)
        rid = json.loads(out.stdout)["request_id"]
        (row,) = _rows(rid, env)
        table = farm("results", rid, env=env).stdout
    assert float(row["late_send_pct"]) > CLIENT_LIMITED_PCT and client_limited(row)  # type: ignore[arg-type]
    assert "client-limited" in table


def test_a_bad_trace_is_a_one_line_usage_error_naming_its_line(tmp_path: Path) -> None:
    unknown = tmp_path / "u.csv"
    unknown.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Session\n1,m,2,3,5,x\n")
    unordered = _mooncake(tmp_path / "o.jsonl", [(0, 512, 32, []), (500, 512, 32, []), (400, 512, 32, [])])
    negative = tmp_path / "n.csv"
    negative.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,3,4\n"
                        "2023-11-16 18:15:40.0000000,3,4\n")
    too_long = _mooncake(tmp_path / "l.jsonl", [(0, 512, 32, []), (10, 8192, 512, [])])
    cases = [(["--trace", str(unknown)], "line 1: unknown column 'Session'"),
             (["--trace", str(unordered)], "line 3: its time (400 ms) is before line 2's"),
             (["--trace", str(negative)], "line 3: its time is before the first row's"),
             (["--trace", str(too_long), *SCALE], "line 2: input 256 + output 16 tokens after --trace-tokens 0.03125 "
                                                  "do not fit the model's context of 200 tokens"),
             (["--trace", str(unordered), "--rate", "5"], "drop --rate")]
    env = farm_env()
    with fake_server(model="tiny", max_model_len=200) as url:
        assert_refused(cases, ["--endpoint", url, "--api", "openai-chat", "--model-name", "tiny"], env)

"""What ``--trace`` sets in a request (``farm.cli.llm_options.with_trace``): mode ``trace`` at the trace's mean rate,
no warm-up, its requests counted; and the request model's checks of mode ``trace`` (``schemas.request``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from farm.cli.llm_options import apply
from farm.errors import RequestError
from schemas import ProfileRequest

ROWS = [(0, 1024, 64), (500, 512, 32), (2000, 256, 16)]


def _request(path: Path, **llm: Any) -> dict[str, Any]:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n"
                            for t, i, o in ROWS))
    base = {"endpoint": "127.0.0.1:8000", "model_name": "m"}
    return apply(base, api="openai-chat", trace=str(path), **llm)


def test_a_trace_sets_its_mode_rate_and_count(tmp_path: Path) -> None:
    data = _request(tmp_path / "t.jsonl", trace_speed=2.0, trace_limit=2)
    m = data["measurement"]
    assert (m["mode"], m["rate"], m["warmup_s"]) == ("trace", 1 / 0.25, 0.0)  # 2 rows 0.25 s apart at speed 2
    assert (m["llm"]["requests"], m["llm"]["warmup_requests"]) == (2, 0)
    request = ProfileRequest.model_validate(data)
    assert request.measurement.mode == "trace" and request.rates == [4.0]


def test_a_trace_refuses_a_rate_and_a_span_past_the_time_limit(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    assert _request(path)["measurement"]["mode"] == "trace"  # the file written, read
    with pytest.raises(RequestError, match="drop --rate"):
        apply({"rates": [5.0], "measurement": {"llm": {"trace": str(path)}}})
    with pytest.raises(RequestError, match="span 20 s at --trace-speed 0.1, past the job's time limit of 10 s"):
        apply({"measurement": {"timeout_s": 10, "llm": {"trace": str(path), "trace_speed": 0.1}}})


@pytest.mark.parametrize(("measurement", "text"), [
    ({"mode": "trace", "rate": 1.0, "llm": {}}, "give --trace FILE"),
    ({"mode": "constant", "rate": 1.0, "llm": {"trace": "t.jsonl"}}, "drop --mode constant"),
    ({"mode": "trace", "rate": 1.0, "search": "quick", "llm": {"trace": "t.jsonl"}}, "drop --search quick"),
    ({"mode": "trace", "rate": 1.0, "llm": {"trace": "t.jsonl", "prompts": "p.jsonl"}}, "give one of them"),
])
def test_mode_trace_and_a_trace_go_together(measurement: dict[str, Any], text: str) -> None:
    with pytest.raises(ValidationError, match=text):
        ProfileRequest.model_validate({"endpoint": "127.0.0.1:8000", "model_name": "m", "measurement": measurement})

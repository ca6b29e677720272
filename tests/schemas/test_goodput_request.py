"""A max-goodput request (``measurement.search: max-goodput``): set up as Poisson arrivals from its start rate,
refused without an SLO or an LLM, or with a rate list, several concurrencies or repeats."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import ProfileRequest
from schemas.request import GOODPUT_START_RATE

BASE = {"endpoint": "http://127.0.0.1:9/v1", "model_name": "m"}
LLM = {"slo": "ttft=200,tpot=50"}


def test_closed_loop_becomes_poisson_at_the_start_rate() -> None:
    r = ProfileRequest.model_validate({**BASE, "measurement": {"search": "max-goodput", "llm": LLM}})
    assert r.measurement.mode == "poisson" and r.measurement.rate == GOODPUT_START_RATE
    r = ProfileRequest.model_validate({**BASE, "rates": [3.33333], "measurement": {"search": "max-goodput",
                                                                                 "llm": LLM}})
    assert r.measurement.mode == "poisson" and r.measurement.rate == 3.33333


@pytest.mark.parametrize("extra,text", [
    ({"measurement": {"search": "max-goodput", "llm": {}}}, "add --slo"),
    ({"measurement": {"search": "max-goodput", "mode": "constant", "rate": 2, "llm": LLM}}, "Poisson"),
    ({"rates": [1, 2], "measurement": {"search": "max-goodput", "llm": LLM}}, "at most one --rate"),
    ({"concurrency": [1, 2], "measurement": {"search": "max-goodput", "llm": LLM}}, "one --concurrency"),
    ({"repeats": 2, "measurement": {"search": "max-goodput", "llm": LLM}}, "repeats"),
])
def test_refused(extra: dict[str, object], text: str) -> None:
    with pytest.raises(ValidationError, match=text):
        ProfileRequest.model_validate({**BASE, **extra})


def test_kserve_request_is_refused() -> None:
    with pytest.raises(ValidationError, match="searches an LLM server"):
        ProfileRequest.model_validate({"endpoint": "127.0.0.1:1", "model_name": "m",
                                       "measurement": {"search": "max-goodput"}})

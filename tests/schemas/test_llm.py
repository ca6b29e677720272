"""The LLM request side (schemas.llm): token lengths, SLOs, HTTP endpoints and how a request carries them."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import MeasurementSettings, ProfileRequest
from schemas.llm import LlmSettings, Slo, TokenDist, parse_slo, split_endpoint


@pytest.mark.parametrize(("text", "kind", "a", "b", "mean"), [
    ("128", "fixed", 128, 0, 128), ("128/32", "normal", 128, 32, 128), ("64:256", "uniform", 64, 256, 160)])
def test_token_lengths_parse(text: str, kind: str, a: float, b: float, mean: float) -> None:
    d = TokenDist.model_validate(text)
    assert (d.kind, d.a, d.b, d.mean, d.text()) == (kind, a, b, mean, text)
    assert TokenDist.model_validate(7).a == 7


@pytest.mark.parametrize("bad", ["", "abc", "10:5", "1.5", "-3", "5/"])
def test_bad_token_lengths_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        TokenDist.model_validate(bad)


def test_slo_parses_and_judges() -> None:
    slo = Slo.model_validate("ttft=200, tpot=50")
    assert (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms) == (200, 50, None)
    assert slo.met(150, 40, 9999) and not slo.met(250, 40, 1) and not slo.met(100, 60, 1)
    assert slo.met(100, None, 1)  # a one-token answer has no TPOT


@pytest.mark.parametrize("bad", ["ttfb=1", "ttft", "ttft=x", ",", "e2e=-1"])
def test_bad_slo_is_refused(bad: str) -> None:
    with pytest.raises((ValueError, ValidationError)):
        Slo.model_validate(parse_slo(bad) if bad != "e2e=-1" else bad)


def test_split_endpoint() -> None:
    assert split_endpoint("http://127.0.0.1:8000") == ("127.0.0.1:8000", "/v1", False)
    assert split_endpoint("https://api.example.com/openai/v1/") == ("api.example.com:443", "/openai/v1", True)
    assert split_endpoint("http://[::1]:9/v1") == ("[::1]:9", "/v1", False)
    for bad in ("ftp://x:1", "127.0.0.1:8000", "http://:80", "http://h:1/v1?x=1"):
        with pytest.raises(ValueError):
            split_endpoint(bad)


def test_request_moves_the_url_into_llm_settings() -> None:
    r = ProfileRequest.model_validate({"endpoint": "http://127.0.0.1:8000/v1", "model_name": "m",
                                       "measurement": {"llm": {"api": "openai-completions"}}})
    assert r.endpoint == "127.0.0.1:8000" and r.engines == ["endpoint"]
    assert r.measurement.llm is not None and r.measurement.llm.base_path == "/v1"
    assert r.measurement.llm.api == "openai-completions"


def test_http_endpoint_without_api_and_wrong_client_are_refused() -> None:
    with pytest.raises(ValidationError, match="--api"):
        ProfileRequest.model_validate({"endpoint": "http://127.0.0.1:8000", "model_name": "m"})
    with pytest.raises(ValidationError, match="openai client"):
        MeasurementSettings(client="perf_analyzer", llm=LlmSettings())
    with pytest.raises(ValidationError, match="--api"):
        MeasurementSettings(client="openai")
    with pytest.raises(ValidationError, match="api_key_env is gone.*--credential"):
        LlmSettings(api_key_env="MY_KEY")  # a request never names a worker's variable (issue 39)
    with pytest.raises(ValidationError, match="not a credential name"):
        LlmSettings(credential="my key")

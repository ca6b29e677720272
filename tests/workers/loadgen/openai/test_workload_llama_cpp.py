"""The workload as asked on a real engine (issue 41 point 1): llama-cpp-python's server on the tiny random GGUF
(``tests.llm_servers``). farm cuts its prompts by the server's own tokenizer (``/extras/tokenize``); the server's
own count of each prompt (``usage.prompt_tokens`` of the same prompt sent unstreamed) matches the request within
2 %, outputs are the length asked, and two requests of the same prompt share no leading token (their salts)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import MeasurementSettings
from schemas.engines import SERVED_MODEL_NAME
from schemas.llm import LlmSettings
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.loadgen.openai.http_once import exchange
from workers.loadgen.openai.request import request_body
from workers.loadgen.openai.server_tokenizer import server_tokenizer
from workers.loadgen.openai.workload import Salts, synthetic_prompts

pytestmark = pytest.mark.llm

IN, OUT = 48, 16


def _post(url: str, body: bytes) -> dict[str, Any]:
    status, raw = exchange(url, method="POST", body=body, headers={"Content-Type": "application/json"},
                           timeout_s=120)
    assert status == 200, raw[:300]
    got: dict[str, Any] = json.loads(raw)
    return got


def test_llama_cpp_sees_the_prompt_and_output_lengths_asked(llama_cpp_url: str) -> None:
    settings = MeasurementSettings(duration_s=2.0, warmup_s=0.3, window_s=1.0,
                                   llm={"api": "openai-completions", "input_tokens": IN, "output_tokens": OUT})
    hostport = llama_cpp_url.removesuffix("/v1").split("//")[1]
    r = run_load(LoadTarget(hostport, SERVED_MODEL_NAME), LoadSpec.from_settings([], 1, 1, settings))
    m, d = r.metrics, r.details
    assert m["error_count"] == 0 and "llama-cpp-python /extras/tokenize" in d["workload"]["prompts_cut_by"]
    assert m["requested_input_tokens_mean"] == m["mean_input_tokens"] == IN and m["input_tokens_off_pct"] == 0
    assert m["mean_output_tokens"] == OUT  # the random model never ends early: one token a chunk, 16 asked

    # the server's own count of the prompts the run sent (the same seed, tokenizer and salts' words)
    tok = server_tokenizer(llama_cpp_url.removesuffix("/v1"), SERVED_MODEL_NAME)
    assert tok is not None
    prompts = synthetic_prompts(LlmSettings(input_tokens=IN, output_tokens=OUT), tok, 4)
    salts = Salts.of(tok).started()
    for k, p in enumerate(prompts):
        body = json.loads(request_body("openai-completions", SERVED_MODEL_NAME, p, True, salts.salt(k)))
        usage = _post(f"{llama_cpp_url}/completions", json.dumps({**body, "stream": False}).encode())["usage"]
        assert usage["prompt_tokens"] == pytest.approx(p.input_tokens, rel=0.02)
        assert usage["completion_tokens"] == OUT
    # two requests of one prompt: by the server's tokenizer their tokens differ from the first one on
    a, b = (tok.ids(prompts[0].salted(salts.salt(k)), special=True)[tok.specials():] for k in (1, 2))
    assert a[0] != b[0] and len(a) == pytest.approx(len(b), abs=1)

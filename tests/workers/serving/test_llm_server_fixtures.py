"""The session fixtures other LLM tests use (``llama_cpp_url``, ``transformers_url``): each serves the tiny model
at its OpenAI base URL, and both servers count the same tokens for the same chat (one tokenizer, one template)."""
from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from schemas.engines import SERVED_MODEL_NAME
from tests.workers.serving.test_llm_engines import stream_chat

pytestmark = pytest.mark.llm


def _usage(url: str, content: str, max_tokens: int = 12) -> dict[str, Any]:
    body = {"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0}
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        usage: dict[str, Any] = json.loads(resp.read())["usage"]
    return usage


def test_both_fixture_servers_stream_and_count_the_same_tokens(llama_cpp_url: str, transformers_url: str) -> None:
    for url in (llama_cpp_url, transformers_url):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        deltas, _ = stream_chat(url, max_tokens=8)
        assert len(deltas) >= 2
    for content in ("Hello world", "The quick brown fox jumps over the lazy dog, 3 times!"):
        ours, theirs = _usage(llama_cpp_url, content), _usage(transformers_url, content)
        assert ours["prompt_tokens"] == theirs["prompt_tokens"] > 3, content
        assert ours["completion_tokens"] == theirs["completion_tokens"] == 12

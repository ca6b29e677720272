"""The body of one streamed OpenAI request, built once per prompt in two parts with the request's salt
(``workload.Salts``) put between them as it is sent, so the load loop does no JSON per request."""
from __future__ import annotations

import json
from dataclasses import dataclass

from workers.loadgen.openai.http_once import exchange
from workers.loadgen.openai.workload import Prompt

#: where the salt goes in a body, as JSON writes it (no prompt holds it: it is cut out of the text)
_MARK = "\x00farm-salt\x00"
_MARK_JSON = json.dumps(_MARK)[1:-1].encode()


def request_body(api: str, model: str, prompt: Prompt, ignore_eos: bool = False, salt: str = "") -> bytes:
    """The JSON body of one streamed request with ``salt`` in place (``Prompt.salted``): both ``max_tokens``
    and (chat) ``max_completion_tokens``, ``stream_options.include_usage`` so the server reports its own token
    counts, and ``ignore_eos`` where asked (outputs of exactly ``max_tokens``)."""
    head, tail = body_parts(api, model, prompt, ignore_eos)
    return head + salt_bytes(prompt, salt) + tail


def body_parts(api: str, model: str, prompt: Prompt, ignore_eos: bool) -> tuple[bytes, bytes]:
    """:func:`request_body` in two parts, the salt's place between them: built once per prompt, the salt put in
    as each request is sent."""
    text = prompt.text if prompt.salt_at is None else prompt.text[:prompt.salt_at] + _MARK + \
        prompt.text[prompt.salt_at:]
    body = base_body(api, model, prompt.max_tokens, ignore_eos)
    if api == "openai-chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    head, _, tail = json.dumps(body).encode().partition(_MARK_JSON)
    return head, tail


def base_body(api: str, model: str, max_tokens: int, ignore_eos: bool) -> dict[str, object]:
    """A streamed request's body but its prompt: both ``max_tokens`` and (chat) ``max_completion_tokens``,
    ``stream_options.include_usage`` so the server reports its own token counts, and ``ignore_eos`` where asked."""
    body: dict[str, object] = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                               "max_tokens": max_tokens}
    if ignore_eos:
        body["ignore_eos"] = True
    if api == "openai-chat":
        body["max_completion_tokens"] = max_tokens
    return body


def salt_bytes(prompt: Prompt, salt: str) -> bytes:
    """The bytes of ``salt`` as ``prompt`` holds it: its first ``salt_words`` words and a space (ASCII words:
    JSON needs no escape); empty for a prompt not salted."""
    if prompt.salt_at is None or not prompt.salt_words:
        return b""
    return (" ".join(salt.split()[:prompt.salt_words]) + " ").encode()


#: the probe's prompt (``probe``): one word
PROBE_TEXT = "hello"


@dataclass(frozen=True)
class Probe:
    """What one request before the run tells of the server: whether it takes ``ignore_eos``, and its count of the
    probe's prompt (``usage.prompt_tokens``; None: not said), from which the tokens its chat template adds follow."""

    ignore_eos: bool = False
    prompt_tokens: int | None = None


def probe(base_url: str, api: str, model: str, key: str | None, authority: str | None,
          timeout_s: float = 60.0) -> Probe:
    """A one-token request of :data:`PROBE_TEXT` with ``ignore_eos``, unstreamed. The server takes the field (vLLM,
    llama.cpp) where it answers below HTTP 400; a strict server (OpenAI's) refuses an unknown field. A server that
    takes the field and ignores it shows in the outputs' lengths (``fidelity``)."""
    prompt = Prompt(PROBE_TEXT, 1, "words", 1)
    head, tail = body_parts(api, model, prompt, ignore_eos=True)
    body = json.loads(head + tail)
    body.pop("stream_options", None)
    body["stream"] = False
    path = "/chat/completions" if api == "openai-chat" else "/completions"
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        status, raw = exchange(base_url + path, method="POST", body=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json", **auth}, timeout_s=timeout_s,
                               limit=1 << 16, authority=authority)
    except OSError:
        return Probe()
    if status >= 400:
        return Probe()
    try:
        usage = json.loads(raw).get("usage") or {}
    except (ValueError, AttributeError):
        usage = {}
    n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return Probe(True, n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None)

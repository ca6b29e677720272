"""The server's own tokenizer, over its tokenize route, so that prompts are cut to the server's count exactly:
llama.cpp's server (``POST /tokenize {"content", "add_special"}`` -> ``{"tokens"}``, ``/detokenize`` ->
``{"content"}``), vLLM's and SGLang's (``POST /tokenize {"model", "prompt", "add_special_tokens"}`` ->
``{"tokens", "count"}``, ``/detokenize`` -> ``{"prompt"}``) and llama-cpp-python's (``POST /extras/tokenize
{"input"}`` -> ``{"tokens"}``, always with its BOS; ``/extras/detokenize`` -> ``{"text"}``). The first route that
tokenizes a probe text answers; :func:`server_tokenizer` is None for a server with none (an OpenAI endpoint).

Only JSON crosses: no file of the model's is read here. Each count is a round trip, so a job cut by the server's
tokenizer builds a smaller pool (``workload.SERVER_POOL`` prompts; the salts keep repeats out of its prefix cache).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from workers.loadgen.openai.http_once import exchange
from workers.loadgen.openai.models_api import headers

PROBE = "hello world"
TIMEOUT_S = 30.0
LIMIT = 64 << 20  # the most bytes of one answer read (a long prompt's token ids)


@dataclass(frozen=True)
class Route:
    """One server's tokenize and detokenize calls: their paths, bodies and answer keys; ``switch``: whether the
    tokenize body can ask for no special tokens (llama-cpp-python's always adds its BOS)."""

    name: str
    tokenize: str
    body: Callable[[str, str, bool], dict[str, Any]]
    detokenize: str
    detok_body: Callable[[str, list[int]], dict[str, Any]]
    text_key: str
    switch: bool = True


ROUTES = (
    Route("vllm", "/tokenize", lambda m, t, s: {"model": m, "prompt": t, "add_special_tokens": s},
          "/detokenize", lambda m, ids: {"model": m, "tokens": ids}, "prompt"),
    Route("llama.cpp", "/tokenize", lambda m, t, s: {"content": t, "add_special": s},
          "/detokenize", lambda m, ids: {"tokens": ids}, "content"),
    Route("llama-cpp-python", "/extras/tokenize", lambda m, t, s: {"model": m, "input": t},
          "/extras/detokenize", lambda m, ids: {"model": m, "tokens": ids}, "text", switch=False),
)


class ServerTokenizer:
    """Counts and cuts texts with the server's tokenizer (``workload.Counting``); counts are cached."""

    source = "server"

    def __init__(self, root: str, model: str, route: Route, key: str | None, authority: str | None) -> None:
        self.root, self.model, self.route = root, model, route
        self.key, self.authority = key, authority
        self.cache: dict[str, int] = {}
        self._bos = 0 if route.switch else self._leading()
        self._specials = len(self.ids(PROBE, special=True)) - len(self.ids(PROBE, special=False))

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON answer of ``POST path``; ConnectionError (one line, what the client reports) on any failure."""
        try:
            status, raw = exchange(self.root + path, method="POST", body=json.dumps(body).encode(),
                                   headers=headers(self.key), timeout_s=TIMEOUT_S, limit=LIMIT,
                                   authority=self.authority)
            if status >= 400:
                raise ConnectionError(f"POST {self.root}{path} answered HTTP {status}")
            return json.loads(raw)
        except ValueError:
            raise ConnectionError(f"POST {self.root}{path} answered no JSON") from None
        except ConnectionError:
            raise
        except OSError as exc:
            raise ConnectionError(f"POST {self.root}{path} failed while farm cut the prompts by the server's "
                                  f"tokenizer ({exc}); check the server") from None

    def _leading(self) -> int:
        """The tokens a route without a switch puts before every text (its BOS): 1 where two texts of different
        first words begin with the same token, else 0."""
        a, b = self.ids("hello world", special=True), self.ids("world hello", special=True)
        return int(bool(a) and bool(b) and a[0] == b[0])

    def ids(self, text: str, special: bool) -> list[int]:
        got = self._post(self.route.tokenize, self.route.body(self.model, text, special))
        ids = got.get("tokens") if isinstance(got, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ConnectionError(f"POST {self.route.tokenize} answered no token list")
        return ids if special or self.route.switch else ids[self._bos:]

    def count(self, text: str) -> int:
        if not text:
            return 0
        if text not in self.cache:
            self.cache[text] = len(self.ids(text, special=False))
        return self.cache[text]

    def cut(self, text: str, n: int) -> str:
        """``text`` cut to its first ``n`` tokens (the server's detokenize), without a leading space."""
        got = self._post(self.route.detokenize, self.route.detok_body(self.model, self.ids(text, special=False)[:n]))
        out = got.get(self.route.text_key) if isinstance(got, dict) else None
        if not isinstance(out, str):
            raise ConnectionError(f"POST {self.route.detokenize} answered no text")
        return out.lstrip(" ")

    def specials(self) -> int:
        return max(0, self._specials)

    def prefetch(self, texts: Iterable[str]) -> None:
        return None


def server_tokenizer(root: str, model: str, key: str | None = None,
                     authority: str | None = None) -> ServerTokenizer | None:
    """The tokenizer of the server at ``root`` (its URL without the API path), by the first of :data:`ROUTES` that
    tokenizes a probe; None where none does."""
    for route in ROUTES:
        try:
            tok = ServerTokenizer(root, model, route, key, authority)
            if tok.count(PROBE) > 0:
                return tok
        except OSError:  # ConnectionError among them: not this route
            continue
    return None

"""What an LLM job sends: its prompts and requested output lengths (``schemas.llm.LlmSettings``), synthetic or
from a prompt file, and the tokenizer that counts tokens where the server does not.

Synthetic prompts are words drawn with the job's seed (the same prompts every run); with a tokenizer they are
cut to the exact token count, without one a word stands for a token (the server's ``usage`` then says the
truth). Prompt files: JSONL (one object a line with ``prompt`` or ``text``, optional ``output_tokens``) or
ShareGPT JSON (a list of ``{"conversations": [{"from": "human", "value": ...}, ...]}``); a bad line is a
``RequestError`` naming it.
"""
from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.errors import RequestError
from schemas.llm import LlmSettings, TokenDist

#: how many distinct synthetic prompts a job cycles through (varied, so a server's prefix cache sees new text)
PROMPT_POOL = 512
WORDS = ("time year people way day man thing woman life child world school state family student group "
          "country problem hand part place case week company system program question work government number "
          "night point home water room mother area money story fact month lot right study book eye job word "
          "business issue side kind head house service friend father power hour game line end member law car "
          "city community name president team minute idea kid body information back parent face others level "
          "office door health person art war history party result change morning reason research girl guy "
          "moment air teacher force education river mountain garden window table paper music light color").split()

Counter = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's prompt, its token count (``input_source``: ``tokenizer`` or ``words``, an estimate) and
    the output tokens it asks for."""

    text: str
    input_tokens: int
    input_source: str
    max_tokens: int


class Tokenizer:
    """A local Hugging Face tokenizer (a ``tokenizer.json`` file or a folder holding one, else a folder
    ``transformers`` can read), never downloaded (``HF_HUB_OFFLINE``). RequestError when it cannot be read."""

    def __init__(self, path: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        p = Path(path).expanduser()
        file = p / "tokenizer.json" if p.is_dir() else p
        self._encode: Callable[[str], list[int]]
        self._decode: Callable[[list[int]], str]
        if file.is_file():
            try:
                from tokenizers import Tokenizer as HfTokenizer  # noqa: PLC0415 - optional (the llm extra), LLM jobs only
                tok = HfTokenizer.from_file(str(file))
            except ImportError:
                raise RequestError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
            except Exception as exc:  # the Rust library raises its own Exception types
                raise RequestError(f"--tokenizer {path}: cannot read {file} ({exc})") from None
            self._encode = lambda text: tok.encode(text, add_special_tokens=False).ids
            self._decode = lambda ids: tok.decode(ids)
        elif p.is_dir():
            try:
                from transformers import AutoTokenizer  # noqa: PLC0415 - heavy, optional; a folder without tokenizer.json only
                auto = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            except Exception as exc:  # ImportError or any reader error: one line either way
                raise RequestError(f"--tokenizer {path}: no tokenizer.json there and transformers cannot read it "
                                   f"({type(exc).__name__}: {exc})") from None
            self._encode = lambda text: list(auto.encode(text, add_special_tokens=False))
            self._decode = lambda ids: str(auto.decode(ids))
        else:
            raise RequestError(f"--tokenizer {path}: no such file or folder; give a tokenizer.json or its folder")

    def count(self, text: str) -> int:
        return len(self._encode(text)) if text else 0

    def cut(self, text: str, n: int) -> str:
        """``text`` cut to its first ``n`` tokens."""
        return self._decode(self._encode(text)[:n])


def _draw(dist: TokenDist, rng: random.Random) -> int:
    if dist.kind == "normal":
        return max(1, round(rng.gauss(dist.a, dist.b)))
    if dist.kind == "uniform":
        return rng.randint(int(dist.a), int(dist.b))
    return max(1, int(dist.a))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _synthetic(text_rng: random.Random, n: int, tok: Tokenizer | None) -> tuple[str, int, str]:
    """A prompt of ``n`` tokens: exact with a tokenizer (words, encoded and cut), else ``n`` words."""
    if tok is None:
        return _words(text_rng, n), n, "words"
    text = _words(text_rng, n + 8)
    while tok.count(text) < n:
        text += " " + _words(text_rng, n)
    text = tok.cut(text, n)
    return text, tok.count(text), "tokenizer"


def synthetic_prompts(llm: LlmSettings, tok: Tokenizer | None, count: int = PROMPT_POOL) -> list[Prompt]:
    """``count`` prompts of the settings' lengths, a shared prefix in front, the same for the same seed."""
    rng = random.Random(llm.seed)
    prefix, prefix_n, _ = _synthetic(random.Random(llm.seed + 1), llm.prefix_tokens, tok) if llm.prefix_tokens \
        else ("", 0, "")
    out = []
    for _ in range(count):
        n_in, n_out = _draw(llm.input_tokens, rng), _draw(llm.output_tokens, rng)
        text, got, source = _synthetic(rng, n_in, tok)
        full = f"{prefix} {text}" if prefix else text
        n = tok.count(full) if tok is not None and prefix else got + prefix_n
        out.append(Prompt(full, n, source, n_out))
    return out


def _file_items(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of a JSONL file, or (item number, item) of a JSON list (ShareGPT)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RequestError(f"--prompts {path}: cannot read it ({exc})") from None
    if raw.lstrip().startswith("["):
        try:
            items = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestError(f"--prompts {path}: not valid JSON ({exc}); give JSONL or a ShareGPT JSON list") \
                from None
        yield from enumerate(items, 1)
        return
    for i, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as exc:
                raise RequestError(f"--prompts {path}: line {i} is not JSON ({exc.msg})") from None


def _prompt_of(item: Any) -> tuple[str | None, int | None]:
    """The prompt text and output tokens (None: not given) of one JSONL object or ShareGPT conversation."""
    if not isinstance(item, dict):
        return None, None
    conv = item.get("conversations")
    if isinstance(conv, list):
        human = next((c.get("value") for c in conv if isinstance(c, dict) and c.get("from") in ("human", "user")),
                     None)
        return (human if isinstance(human, str) else None), None
    text = item.get("prompt", item.get("text"))
    out = item.get("output_tokens", item.get("max_tokens"))
    return (text if isinstance(text, str) else None), (out if isinstance(out, int) and out > 0 else None)


def file_prompts(llm: LlmSettings, tok: Tokenizer | None) -> list[Prompt]:
    """The prompts of ``llm.prompts``; output tokens from the file where given, else ``output_tokens``.
    RequestError names the first bad line (not JSON, no prompt text) or an empty file."""
    assert llm.prompts is not None
    path = Path(llm.prompts).expanduser()
    rng = random.Random(llm.seed)
    out = []
    for i, item in _file_items(path):
        text, n_out = _prompt_of(item)
        if not text:
            raise RequestError(f"--prompts {path}: item {i} has no prompt text (JSONL: a \"prompt\" or \"text\" "
                               "string; ShareGPT: a human turn in \"conversations\")")
        n_in, source = (tok.count(text), "tokenizer") if tok is not None else (len(text.split()), "words")
        out.append(Prompt(text, n_in, source, n_out or _draw(llm.output_tokens, rng)))
    if not out:
        raise RequestError(f"--prompts {path}: holds no prompt")
    return out


def load_workload(llm: LlmSettings) -> tuple[list[Prompt], Tokenizer | None]:
    """The job's prompts and its tokenizer (None without ``--tokenizer``); RequestError on bad input."""
    tok = Tokenizer(llm.tokenizer) if llm.tokenizer else None
    return (file_prompts(llm, tok) if llm.prompts else synthetic_prompts(llm, tok)), tok

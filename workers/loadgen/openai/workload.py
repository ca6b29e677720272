"""What an LLM job sends: its prompts and requested output lengths (``schemas.llm.LlmSettings``), synthetic or
from a prompt file, and the tokenizer that counts tokens where the server does not.

Synthetic prompts are words drawn with the job's seed (the same prompts every run); with a tokenizer they are
cut to the exact token count, without one a word stands for a token (the server's ``usage`` then says the
truth). A prompt's token count is the server's: its text's tokens and those the tokenizer adds to a prompt
(``specials``: a BOS). Every request is salted (:class:`Salts`): a block of ``SALT_WORDS`` words, each one token,
unique to the request within its run and across runs, at the prompt's start (after the shared prefix, where the
workload asks for one), so that unrelated requests share no prefix a server's prefix cache could serve, even when
the pool repeats; the salt's tokens are part of the count.

The pool holds at most ``POOL_TOKENS`` tokens in all (fewer distinct prompts when they are long), so a
long prompt never makes the worker build gigabytes of text. Prompt files: JSONL (one object a line with
``prompt`` or ``text``, optional ``output_tokens``) or ShareGPT JSON (a list of ``{"conversations": [{"from":
"human", "value": ...}, ...]}``), read from the request's upload (``jailed_workload``) up to
``FARM_MAX_WORKLOAD_FILE_BYTES``; a bad line, or a prompt longer than ``FARM_MAX_PROMPT_TOKENS``, is a ``RequestError``
naming it. A tokenizer is parsed only in the jail (``jailed_workload``): here it is anything that counts and cuts.
"""
from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from farm.errors import RequestError
from farm.settings import get_settings
from schemas.llm import MAX_TOKENS, LlmSettings, TokenDist

#: how many distinct synthetic prompts a job cycles through (varied, so a server's prefix cache sees new text)
PROMPT_POOL = 512
#: the distinct synthetic prompts a job cut by the server's own tokenizer builds (each count a round trip to it;
#: the salts keep the repeats out of its prefix cache)
SERVER_POOL = 64
#: the most tokens the synthetic pool holds in all (about 6 bytes of text each): long prompts, fewer of them
POOL_TOKENS = 4_000_000
WORDS = ("time year people way day man thing woman life child world school state family student group "
          "country problem hand part place case week company system program question work government number "
          "night point home water room mother area money story fact month lot right study book eye job word "
          "business issue side kind head house service friend father power hour game line end member law car "
          "city community name president team minute idea kid body information back parent face others level "
          "office door health person art war history party result change morning reason research girl guy "
          "moment air teacher force education river mountain garden window table paper music light color").split()

#: the words of a request's salt (fewer in a prompt too short to hold them and a token more)
SALT_WORDS = 4
#: how often a synthetic prompt is cut again when the salted whole counts off its length (words merged at a join)
FIT_TRIES = 3
#: the fewest one-token words a salt is drawn from; with fewer, any word is taken (the count is then approximate)
MIN_SALT_WORDS = 16

Counter = Callable[[str], int]


class Counting(Protocol):
    """A tokenizer as the workload uses it: counts a text's tokens, cuts a text to its first ``n``, and says how
    many tokens it adds to a prompt (``specials``: a BOS; 0 where it adds none)."""

    def count(self, text: str) -> int: ...
    def cut(self, text: str, n: int) -> str: ...
    def specials(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's prompt (its text without the salt), its token count with the salt's (``input_source``:
    ``tokenizer``, ``server`` (its /tokenize) or ``words``, an estimate) and the output tokens it asks for;
    ``salt_at``: where in ``text`` the salt goes (None: not salted), ``salt_words``: its words; ``turn``: its turn in
    a session (1, 2, ...: ``sessions``; 0: a prompt of its own)."""

    text: str
    input_tokens: int
    input_source: str
    max_tokens: int
    salt_at: int | None = None
    salt_words: int = 0
    turn: int = 0

    def salted(self, salt: str) -> str:
        """The text with ``salt`` (``Salts.salt``, ``salt_words`` words) in place."""
        if self.salt_at is None:
            return self.text
        return self.text[:self.salt_at] + " ".join(salt.split()[:self.salt_words]) + " " + self.text[self.salt_at:]


@dataclass(frozen=True, slots=True)
class Salts:
    """The salts of a run: ``SALT_WORDS`` words from ``words`` (each ``per_word`` tokens, by the tokenizer, alone and
    in a row), the request's number written in their base from a random start of the run's (``offset``), so that no
    two requests of a run, and hardly any of two runs, share one."""

    words: tuple[str, ...]
    offset: int = 0
    per_word: int = 1

    @classmethod
    def of(cls, tok: Counting | None) -> Salts:
        """The words of ``WORDS`` that ``tok`` counts as the fewest tokens each, alone and in a row, of which there
        are ``MIN_SALT_WORDS`` at least (a small vocabulary has few one-token words); all of them without one."""
        if tok is None:
            return cls(tuple(WORDS))
        prefetch = getattr(tok, "prefetch", None)  # a jailed tokenizer: all counts in one round trip
        if prefetch is not None:
            prefetch([*WORDS, *(f"{w} {w}" for w in WORDS)])
        by_count: dict[int, list[str]] = {}
        for w in WORDS:
            n = tok.count(w)
            if tok.count(f"{w} {w}") == 2 * n:
                by_count.setdefault(n, []).append(w)
        for n, words in sorted(by_count.items()):
            if len(words) >= MIN_SALT_WORDS:
                return cls(tuple(words), per_word=n)
        return cls(tuple(WORDS))

    def started(self) -> Salts:
        """These salts from a random start (a run's own)."""
        return Salts(self.words, random.SystemRandom().randrange(len(self.words) ** SALT_WORDS), self.per_word)

    def salt(self, seq: int) -> str:
        """Request ``seq``'s salt: ``SALT_WORDS`` words."""
        k, base, out = (self.offset + seq) % len(self.words) ** SALT_WORDS, len(self.words), []
        for _ in range(SALT_WORDS):
            k, digit = divmod(k, base)
            out.append(self.words[digit])
        return " ".join(out)


class Tokenizer:
    """A local Hugging Face tokenizer (a ``tokenizer.json`` file or a folder holding one, else a folder
    ``transformers`` can read), never downloaded (``HF_HUB_OFFLINE``). RequestError when it cannot be read.
    Parsing runs the file's reader in this process: only inside the jail (``jailed_workload``), or where the
    operator trusts this host's models."""

    def __init__(self, path: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        p = Path(path).expanduser()
        file = p / "tokenizer.json" if p.is_dir() else p
        self._encode: Callable[[str], list[int]]
        self._encode_special: Callable[[str], list[int]]
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
            self._encode_special = lambda text: tok.encode(text).ids
            self._decode = lambda ids: tok.decode(ids)
        elif p.is_dir():
            try:
                from transformers import AutoTokenizer  # noqa: PLC0415 - heavy, optional; a folder without tokenizer.json only
                auto = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            except Exception as exc:  # ImportError or any reader error: one line either way
                raise RequestError(f"--tokenizer {path}: no tokenizer.json there and transformers cannot read it "
                                   f"({type(exc).__name__}: {exc})") from None
            self._encode = lambda text: list(auto.encode(text, add_special_tokens=False))
            self._encode_special = lambda text: list(auto.encode(text))
            self._decode = lambda ids: str(auto.decode(ids))
        else:
            raise RequestError(f"--tokenizer {path}: no such file or folder; give a tokenizer.json or its folder")

        self._specials = len(self._encode_special("x")) - len(self._encode("x"))

    def count(self, text: str) -> int:
        return len(self._encode(text)) if text else 0

    def cut(self, text: str, n: int) -> str:
        """``text`` cut to its first ``n`` tokens."""
        return self._decode(self._encode(text)[:n])

    def specials(self) -> int:
        """The tokens the tokenizer adds to a text (``add_special_tokens``: a BOS), as a server does to a prompt."""
        return max(0, self._specials)


class Framed:
    """A tokenizer whose prompts the server frames with ``extra`` tokens of its own (a chat template, measured by
    ``request.probe``) in place of the tokenizer's specials."""

    def __init__(self, tok: Counting, extra: int) -> None:
        self.tok, self.extra = tok, max(0, extra)
        self.source = getattr(tok, "source", "tokenizer")

    def count(self, text: str) -> int:
        return self.tok.count(text)

    def cut(self, text: str, n: int) -> str:
        return self.tok.cut(text, n)

    def specials(self) -> int:
        return self.extra

    def prefetch(self, texts: list[str]) -> None:
        prefetch = getattr(self.tok, "prefetch", None)
        if prefetch is not None:
            prefetch(texts)


def _draw(dist: TokenDist, rng: random.Random) -> int:
    if dist.kind == "normal":  # cut at mean + 4 stddev: the bound the request was checked against
        return max(1, min(dist.upper(), round(rng.gauss(dist.a, dist.b))))
    if dist.kind == "uniform":
        return rng.randint(int(dist.a), int(dist.b))
    return max(1, int(dist.a))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _synthetic(text_rng: random.Random, n: int, tok: Counting | None) -> tuple[str, int, str]:
    """A prompt of ``n`` tokens: exact with a tokenizer (words, encoded and cut), else ``n`` words."""
    if tok is None:
        return _words(text_rng, n), n, "words"
    text = _words(text_rng, n + 8)
    while tok.count(text) < n:
        text += " " + _words(text_rng, n)
    text = tok.cut(text, n)
    return text, tok.count(text), "tokenizer"


def pool_size(llm: LlmSettings, count: int = PROMPT_POOL) -> int:
    """How many distinct synthetic prompts a job builds: ``count``, fewer where they would pass ``POOL_TOKENS``."""
    return max(1, min(count, POOL_TOKENS // max(1, llm.input_tokens.upper())))


def _salt_n(n: int, per_word: int) -> int:
    """The salt words a prompt of ``n`` tokens holds: ``SALT_WORDS``, fewer where it is short (one token left)."""
    return max(0, min(SALT_WORDS, (n - 1) // max(1, per_word)))


def _count(tok: Counting | None, prompt: Prompt, salts: Salts) -> int:
    """A prompt's tokens as the server counts them, its salt (the first request's) and the tokenizer's specials."""
    if tok is None:
        return len(prompt.salted(salts.salt(0)).split())
    return tok.count(prompt.salted(salts.salt(0))) + tok.specials()


def _fit(tok: Counting | None, prefix: str, want: int, seed: float, salts: Salts, n_out: int) -> Prompt:
    """A prompt of ``want`` tokens by the server's count: the prefix, the salt, then words drawn with ``seed`` cut
    to what is left, cut again (``FIT_TRIES``) where the whole counts off (a word merged at a join)."""
    specials = tok.specials() if tok is not None else 0
    body_n = max(1, want - specials - (tok.count(prefix) if tok is not None and prefix else len(prefix.split())))
    salt_n = _salt_n(body_n, salts.per_word)
    at = len(prefix) + 1 if prefix else 0
    source = "words" if tok is None else getattr(tok, "source", "tokenizer")
    n = body_n - salt_n * salts.per_word
    p = Prompt("", 0, source, n_out)
    for _ in range(FIT_TRIES):
        text = _synthetic(random.Random(seed), max(1, n), tok)[0]
        p = Prompt(f"{prefix} {text}" if prefix else text, 0, source, n_out, at if salt_n else None, salt_n)
        got = _count(tok, p, salts)
        p = Prompt(p.text, got, source, n_out, p.salt_at, salt_n)
        if got == want or n + want - got < 1:
            break
        n += want - got
    return p


def shared_prefix(llm: LlmSettings, tok: Counting | None) -> str:
    """The text of the workload's shared prefix (``prefix_tokens``; empty without one), the same for the same seed."""
    return _synthetic(random.Random(llm.seed + 1), llm.prefix_tokens, tok)[0] if llm.prefix_tokens else ""


def synthetic_prompts(llm: LlmSettings, tok: Counting | None, count: int = PROMPT_POOL,
                      salts: Salts | None = None) -> list[Prompt]:
    """Up to ``count`` prompts of the settings' lengths (:func:`pool_size`), a shared prefix in front, each salted
    after it (``salts``: those of ``tok``), the same for the same seed. The lengths count the salt and the
    tokenizer's specials: a prompt of ``n`` tokens and a prefix of ``p`` are ``n + p`` by the server's count."""
    count = pool_size(llm, count)
    salts = salts or Salts.of(tok)
    rng = random.Random(llm.seed)
    prefix = shared_prefix(llm, tok)
    out = []
    for _ in range(count):
        n_in, n_out = _draw(llm.input_tokens, rng), _draw(llm.output_tokens, rng)
        out.append(_fit(tok, prefix, n_in + llm.prefix_tokens, rng.random(), salts, n_out))
    return out


def _file_items(path: Path, label: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of a JSONL file, or (item number, item) of a JSON list (ShareGPT); at most
    ``FARM_MAX_WORKLOAD_FILE_BYTES`` of it are read."""
    cap = get_settings().max_workload_file_bytes
    try:
        with open(path, "rb") as f:
            data = f.read(cap + 1)
        raw = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RequestError(f"--prompts {label}: cannot read it ({exc})") from None
    if len(data) > cap:
        raise RequestError(f"--prompts {label}: larger than the {cap / 2**20:.0f} MiB a request may upload "
                           "(FARM_MAX_WORKLOAD_FILE_BYTES)")
    if raw.lstrip().startswith("["):
        try:
            items = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestError(f"--prompts {label}: not valid JSON ({exc}); give JSONL or a ShareGPT JSON list") \
                from None
        yield from enumerate(items, 1)
        return
    for i, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as exc:
                raise RequestError(f"--prompts {label}: line {i} is not JSON ({exc.msg})") from None


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


def file_prompts(llm: LlmSettings, path: Path, tok: Counting | None, salts: Salts | None = None) -> list[Prompt]:
    """The prompts of the file at ``path`` (the request's ``llm.prompts``), each salted at its start (its count with
    the salt's and the tokenizer's specials); output tokens from the file where given, else ``output_tokens``.
    RequestError names the first bad line (not JSON, no prompt text, a prompt over ``FARM_MAX_PROMPT_TOKENS``, an
    output over the schema's bound) or an empty file."""
    label = str(getattr(llm.prompts, "label", None) or llm.prompts or path)
    cap = get_settings().max_prompt_tokens
    rng = random.Random(llm.seed)
    salts = salts or Salts.of(tok)
    out = []
    for i, item in _file_items(path, label):
        text, n_out = _prompt_of(item)
        if not text:
            raise RequestError(f"--prompts {label}: item {i} has no prompt text (JSONL: a \"prompt\" or \"text\" "
                               "string; ShareGPT: a human turn in \"conversations\")")
        salted = Prompt(text, 0, "", 0, 0, SALT_WORDS)
        n_in = _count(tok, salted, salts)
        source = "words" if tok is None else getattr(tok, "source", "tokenizer")
        if n_in > cap:
            raise RequestError(f"--prompts {label}: item {i} holds {n_in} tokens ({source}), above the {cap} a prompt "
                               "may hold here (FARM_MAX_PROMPT_TOKENS)")
        if n_out is not None and n_out > MAX_TOKENS:
            raise RequestError(f"--prompts {label}: item {i} asks for {n_out} output tokens, above {MAX_TOKENS}")
        out.append(Prompt(text, n_in, source, n_out or _draw(llm.output_tokens, rng), 0, SALT_WORDS))
    if not out:
        raise RequestError(f"--prompts {label}: holds no prompt")
    return out

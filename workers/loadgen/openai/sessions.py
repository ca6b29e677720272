"""The conversations of a sessions workload (``--sessions``, ``schemas.llm.LlmSettings.sessions``) and the bodies of
their turns.

A session is a run of prompts in the job's prompt list (``Prompt.turn`` 1, 2, ...): synthetic (``--sessions N``: N
turns of ``input_tokens`` each, answers of ``output_tokens``, drawn with the job's seed) or a ShareGPT file's
conversations (``--sessions sharegpt``: each human turn in order, each asking for as many tokens as the recorded
answer after it holds). The load loop (``load_loop``) sends a session's turns in order, each with the history: the
earlier turns' prompts and the server's actual answers, as chat messages (``openai-chat``) or one text (each answer
right after its prompt, a blank line before the next turn: ``openai-completions``).

Salts: a session's first turn carries the session's salt (``workload.Salts``, one per session, not per request), so
that the turns of one session share their whole history as a prefix (what a server's prefix cache is meant to
serve) and two sessions share nothing past the chat template's opening tokens.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from farm.errors import RequestError
from schemas.llm import MAX_TOKENS, LlmSettings
from workers.loadgen.openai.request import base_body
from workers.loadgen.openai.stream import RawRequest, kinds, replay
from workers.loadgen.openai.workload import (
    PROMPT_POOL,
    SALT_WORDS,
    Counting,
    Prompt,
    Salts,
    _count,
    _draw,
    _file_items,
    _fit,
    _synthetic,
    pool_size,
    shared_prefix,
)

#: what separates a completion's answer from the next turn's prompt in a completions session's text
TURN_GAP = "\n\n"


def _source(tok: Counting | None) -> str:
    return "words" if tok is None else getattr(tok, "source", "tokenizer")


def synthetic_sessions(llm: LlmSettings, tok: Counting | None, count: int = PROMPT_POOL,
                       salts: Salts | None = None) -> list[Prompt]:
    """Sessions of ``llm.sessions`` turns (their prompts in order, ``turn`` 1..N), as many as the prompt pool holds
    (``workload.pool_size`` prompts in all, at least one session): the first turn of each begins with the shared
    prefix (``prefix_tokens``, the same in every session: a system prompt) and its salt, the others are not salted
    (their history is the session's own)."""
    turns = int(llm.sessions or 1)
    salts = salts or Salts.of(tok)
    rng = random.Random(llm.seed)
    prefix = shared_prefix(llm, tok)
    out: list[Prompt] = []
    for _ in range(max(1, pool_size(llm, count) // turns)):
        for k in range(1, turns + 1):
            n_in, n_out = _draw(llm.input_tokens, rng), _draw(llm.output_tokens, rng)
            if k == 1:
                p = _fit(tok, prefix, n_in + llm.prefix_tokens, rng.random(), salts, n_out)
            else:
                text, n, _ = _synthetic(random.Random(rng.random()), n_in, tok)
                p = Prompt(text, n, _source(tok), n_out)
            out.append(Prompt(p.text, p.input_tokens, p.input_source, p.max_tokens, p.salt_at, p.salt_words, k))
    return out


def _turns(item: Any) -> list[tuple[str, str | None]]:
    """(a human turn's text, the recorded answer after it or None) of one ShareGPT item, in order."""
    conv = item.get("conversations") if isinstance(item, dict) else None
    if not isinstance(conv, list):
        return []
    out: list[tuple[str, str | None]] = []
    for c in conv:
        if not isinstance(c, dict) or not isinstance(c.get("value"), str):
            continue
        if c.get("from") in ("human", "user"):
            out.append((c["value"], None))
        elif out and out[-1][1] is None:
            out[-1] = (out[-1][0], c["value"])
    return out


def sharegpt_sessions(llm: LlmSettings, path: Path, tok: Counting | None, salts: Salts | None = None) -> list[Prompt]:
    """The multi-turn conversations (two human turns or more) of the ShareGPT file at ``path``, each replayed whole:
    its human turns in order, each asking for the tokens of the recorded answer after it (else ``output_tokens``).
    RequestError (one line) for a file holding no multi-turn conversation."""
    label = str(getattr(llm.prompts, "label", None) or llm.prompts or path)
    salts = salts or Salts.of(tok)
    rng = random.Random(llm.seed)
    out: list[Prompt] = []
    for _, item in _file_items(path, label):
        turns = _turns(item)
        if len(turns) < 2:
            continue
        for k, (text, answer) in enumerate(turns, 1):
            n_out = min(MAX_TOKENS, max(1, _counted(tok, answer))) if answer else _draw(llm.output_tokens, rng)
            salted = Prompt(text, 0, "", 0, 0, SALT_WORDS) if k == 1 else Prompt(text, 0, "", 0)
            n_in = _count(tok, salted, salts) if k == 1 else _counted(tok, text)
            out.append(Prompt(text, n_in, _source(tok), n_out, salted.salt_at, salted.salt_words, k))
    if not out:
        raise RequestError(f"--prompts {label}: holds no multi-turn conversation (two human turns or more in "
                           "\"conversations\"); --sessions sharegpt replays conversations whole: give a ShareGPT file "
                           "with some, or --sessions N for synthetic ones")
    return out


def _counted(tok: Counting | None, text: str) -> int:
    return tok.count(text) if tok is not None else len(text.split())


def split_sessions(prompts: tuple[Prompt, ...]) -> list[tuple[Prompt, ...]]:
    """The sessions of a prompt list: each run from a ``turn`` 1 to the next (none: not a sessions workload)."""
    out: list[list[Prompt]] = []
    for p in prompts:
        if p.turn == 1:
            out.append([])
        if p.turn and out:
            out[-1].append(p)
    return [tuple(s) for s in out]


def turn_body(api: str, model: str, history: list[tuple[str, str]], prompt: Prompt, salt: str,
              ignore_eos: bool) -> bytes:
    """The JSON body of one turn: ``history`` (each earlier turn's prompt as sent and the server's answer, in order)
    then ``prompt`` (salted with ``salt`` where it is a session's first turn)."""
    text = prompt.salted(salt)
    body = base_body(api, model, prompt.max_tokens, ignore_eos)
    if api == "openai-chat":
        body["messages"] = [*_messages(history), {"role": "user", "content": text}]
    else:
        body["prompt"] = "".join(f"{asked}{answer}{TURN_GAP}" for asked, answer in history) + text
    return json.dumps(body).encode()


def _messages(history: list[tuple[str, str]]) -> Iterator[dict[str, str]]:
    for asked, answer in history:
        yield {"role": "user", "content": asked}
        yield {"role": "assistant", "content": answer}


def answer_text(rec: RawRequest) -> str:
    """The answer a turn's history keeps: its content and tool-call text (reasoning left out, as chat clients do)."""
    return "".join(t for t, k in zip(rec.chunk_text, kinds(rec), strict=True) if k != "reasoning")


#: a new request record of the load loop: (scheduled, sent, its prompt, the prompt tokens it is meant to hold)
NewRecord = Callable[[float, float, Prompt, int], RawRequest]
#: the load loop's send of one request and its wait for the end of the answer
Send = Callable[[RawRequest, bytes], Awaitable[None]]


class SessionRunner:
    """Runs sessions for the load loop: each session's turns in order, each with its history, ``think_s`` between an
    answer and the next turn. A turn that fails ends its session (the rest would carry a broken history). Each answer
    is parsed as it ends (``stream.replay``: its history is the next turn's): a few JSON parses per turn on the loop,
    where a single-turn request defers all of them to the run's end."""

    def __init__(self, sessions: list[tuple[Prompt, ...]], api: str, model: str, ignore_eos: bool, think_s: float,
                 salts: Salts, new: NewRecord, send: Send, stop: asyncio.Event) -> None:
        self.sessions, self.api, self.model, self.ignore_eos = sessions, api, model, ignore_eos
        self.think_s, self.salts, self.new, self.send, self.stop = think_s, salts, new, send, stop
        self.next = itertools.cycle(range(len(sessions))).__next__
        self.started = 0  # sessions started: the number of the next one's salt

    async def run(self, scheduled: float, sent: float) -> None:
        """One session, its first turn scheduled at ``scheduled`` (monotonic s), the others as their think time
        ends."""
        turns = self.sessions[self.next()]
        self.started += 1
        salt = self.salts.salt(self.started)
        history: list[tuple[str, str]] = []
        context = 0  # the history's tokens: the server's count of the last prompt and its answer
        for p in turns:
            rec = self.new(scheduled, sent, p, context + p.input_tokens)
            await self.send(rec, turn_body(self.api, self.model, history, p, salt, self.ignore_eos))
            if rec.error is None and not self.stop.is_set():
                replay(rec)
            if rec.error is not None or self.stop.is_set():
                return
            usage = rec.usage or {}
            said_in, said_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
            context = (said_in if isinstance(said_in, int) else rec.prompt_tokens) + (
                said_out if isinstance(said_out, int) else len(rec.chunk_t))
            history.append((p.salted(salt), answer_text(rec)))
            if self.think_s:
                await asyncio.sleep(self.think_s)
            scheduled = sent = time.monotonic()

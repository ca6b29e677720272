"""A request's workload as a job (or the submitting CLI) reads it: its files from what the request uploaded
(``farm.workload_files``), its tokenizer parsed only in the jail (:func:`open_workload`).

The tokenizer: ``python -m workers.loadgen.openai.jailed_workload PATH`` runs in a
bubblewrap jail without network (``farm.sandbox``), the tokenizer file or folder bound read-only, and answers
JSON lines on stdin with JSON lines on stdout:

- ``{"count": [TEXT, ...]}`` -> ``{"counts": [N, ...]}``
- ``{"cut": [[TEXT, N], ...]}`` -> ``{"texts": [TEXT, ...]}``
- ``{"specials": true}`` -> ``{"specials": N}`` (the tokens it adds to a prompt: a BOS)

Its first line is ``{"ready": true}`` or ``{"error": "..."}``. A tokenizer file is untrusted input (the tokenizers
library parses JSON of any shape, transformers' readers more formats), so farm never parses it in its own process
unless the operator trusts this host's models (``FARM_TRUSTED_MODELS``); where no jail can be made the tokenizer
is refused (:func:`open_tokenizer`). :class:`JailedTokenizer` is the worker's (and the submitting CLI's) side:
counts are cached and asked for in batches, so a run's thousands of chunks cost a few round trips.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from farm.errors import RequestError
from farm.sandbox import code_jail, jail_argv
from farm.secrets import clean_env
from farm.workload_files import check_prompt_bounds, local_files
from schemas.llm import LlmSettings, file_label
from workers.loadgen.openai.sessions import sharegpt_sessions, synthetic_sessions
from workers.loadgen.openai.trace_prompts import trace_prompts
from workers.loadgen.openai.workload import (
    PROMPT_POOL,
    SERVER_POOL,
    Counting,
    Framed,
    Prompt,
    Tokenizer,
    file_prompts,
    synthetic_prompts,
)

MODULE = "workers.loadgen.openai.jailed_workload"
START_TIMEOUT_S = 120.0  # importing tokenizers (or transformers) in a fresh jailed Python
MAX_LINE = 64 << 20  # the longest answer line read back, bytes
BATCH = 2048  # texts per request line


class TokenCounter(Protocol):
    """What the workload and the accounting need of a tokenizer (``workload.Counting`` and ``prefetch``)."""

    def count(self, text: str) -> int: ...
    def cut(self, text: str, n: int) -> str: ...
    def specials(self) -> int: ...
    def prefetch(self, texts: Iterable[str]) -> None: ...


class LocalTokenizer:
    """A tokenizer parsed in this process (the jail's side, or a host whose operator trusts its models)."""

    def __init__(self, path: str) -> None:
        self.tok = Tokenizer(path)

    def count(self, text: str) -> int:
        return self.tok.count(text)

    def cut(self, text: str, n: int) -> str:
        return self.tok.cut(text, n)

    def specials(self) -> int:
        return self.tok.specials()

    def prefetch(self, texts: Iterable[str]) -> None:
        return None


class JailedTokenizer:
    """The client of a jailed tokenizer process (see the module docstring); a context manager that stops it."""

    def __init__(self, path: Path, label: str) -> None:
        self.label = label
        self.cache: dict[str, int] = {}
        self._specials: int | None = None
        argv = jail_argv([sys.executable, "-m", MODULE, str(path.resolve())], network=False, read_only=[path])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=clean_env(), start_new_session=True)
        first = self._read()
        if "error" in first:
            self.close()
            raise RequestError(f"--tokenizer {label}: {str(first['error'])[:300]}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline(MAX_LINE)
        try:
            got = json.loads(line)
        except ValueError:
            got = None
        if not isinstance(got, dict):
            if self.proc.poll() is None:
                self.proc.kill()
            tail = " ".join((self.proc.stderr.read(1 << 16) if self.proc.stderr else "").split())[-300:]
            self.close()
            raise RequestError(f"--tokenizer {self.label}: the sandboxed tokenizer failed ({tail or 'no output'})")
        return got

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # _read says what happened
        return self._read()

    def prefetch(self, texts: Iterable[str]) -> None:
        """Count every text of ``texts`` not counted yet, in batches."""
        todo = list(dict.fromkeys(t for t in texts if t and t not in self.cache))
        for i in range(0, len(todo), BATCH):
            part = todo[i:i + BATCH]
            counts = self._ask({"count": part}).get("counts")
            if not isinstance(counts, list) or len(counts) != len(part):
                raise RequestError(f"--tokenizer {self.label}: the sandboxed tokenizer answered no counts")
            self.cache.update(zip(part, (int(c) for c in counts), strict=True))

    def count(self, text: str) -> int:
        if not text:
            return 0
        if text not in self.cache:
            self.prefetch([text])
        return self.cache[text]

    def cut(self, text: str, n: int) -> str:
        texts = self._ask({"cut": [[text, n]]}).get("texts")
        if not isinstance(texts, list) or len(texts) != 1:
            raise RequestError(f"--tokenizer {self.label}: the sandboxed tokenizer answered no text")
        return str(texts[0])

    def specials(self) -> int:
        if self._specials is None:
            got = self._ask({"specials": True}).get("specials")
            if not isinstance(got, int):
                raise RequestError(f"--tokenizer {self.label}: the sandboxed tokenizer answered no count")
            self._specials = got
        return self._specials

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def open_tokenizer(path: Path, label: str) -> Iterator[TokenCounter]:
    """The tokenizer at ``path``: in a jail (:class:`JailedTokenizer`), or in this process where the operator trusts
    this host's models; SandboxError where it must be jailed and cannot (refused, never parsed unjailed)."""
    if not code_jail(f"the tokenizer {label}"):
        yield LocalTokenizer(str(path))
        return
    tok = JailedTokenizer(path, label)
    try:
        yield tok
    finally:
        tok.close()


@contextmanager
def open_workload(llm: LlmSettings, submitting: bool = False, server: Counting | None = None,
                  framed: tuple[str, int] | None = None) -> Iterator[tuple[list[Prompt], TokenCounter | None]]:
    """The job's prompts and its tokenizer (None without one; open until the block ends), its files read from what
    the request uploaded (``submitting``: the submitter's own paths, before upload); its bounds checked before
    anything is built (``farm.workload_files.check_prompt_bounds``). The prompts are cut by ``server`` (the server's
    own tokenizer, ``server_tokenizer``) where given, else by the job's tokenizer, else by words; ``framed``: a text
    and the server's count of it as a chat prompt (``request.probe``), so that a chat template's tokens count.
    RequestError (one line) on bad input; SandboxError for a tokenizer on a host that cannot jail it."""
    check_prompt_bounds(llm)
    with local_files(llm, submitting) as files, \
            (open_tokenizer(files["tokenizer"], str(file_label(llm.tokenizer))) if "tokenizer" in files
             else nullcontext()) as tok:
        cutter: Counting | None = server or tok
        if cutter is not None and framed is not None:
            cutter = Framed(cutter, framed[1] - cutter.count(framed[0]))
        pool = SERVER_POOL if server is not None else PROMPT_POOL  # the server's: a round trip a count
        prompts = (sharegpt_sessions(llm, files["prompts"], cutter) if llm.sessions == "sharegpt"
                   else synthetic_sessions(llm, cutter, pool) if llm.sessions is not None
                   else file_prompts(llm, files["prompts"], cutter) if "prompts" in files
                   else trace_prompts(llm, files["trace"], cutter) if "trace" in files
                   else synthetic_prompts(llm, cutter, pool))
        yield prompts, tok


def serve(path: str) -> int:
    """The jail's side: load the tokenizer, say so, then answer requests until stdin ends."""
    try:
        tok = Tokenizer(path)
    except Exception as exc:  # RequestError or the library's own: one line back to the worker
        print(json.dumps({"error": str(exc)}), flush=True)
        return 2
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if "count" in req:
                out: dict[str, Any] = {"counts": [tok.count(str(t)) for t in req["count"]]}
            elif "specials" in req:
                out = {"specials": tok.specials()}
            else:
                out = {"texts": [tok.cut(str(t), int(n)) for t, n in req["cut"]]}
        except Exception as exc:  # a bad request from the worker: said, not crashed
            out = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1]))

"""A scripted fake OpenAI streaming server for tests and ``benchmarks/llm_client.py``: its own process
(``python -m tests.fake_openai``), HTTP/1.1 keep-alive with chunked server-sent events, a known TTFT and
inter-token gap, ``k`` tokens per chunk, and a log of the truth: per request the monotonic time its body was
read and the time each token's chunk was written (same clock as the client's on one machine).

A known capacity on demand (``--slots N``): at most N answers stream at once, the others wait in a FIFO queue
before their headers are sent (a server with N batch slots and a fixed per-token time): N / (TTFT + (tokens -
1) x ITL) requests/s in all, and a sharp SLO edge near it (``benchmarks/llm_goodput_search.py``).

A reasoning model on demand (``--reasoning N``: the first N tokens of each answer as ``delta.reasoning_content``,
``--tool-tokens N``: the last N as ``delta.tool_calls`` arguments); an early end of sequence (``--eos-at N``: N
tokens, unless the request asks ``ignore_eos``); llama.cpp's ``POST /tokenize``/``/detokenize`` (a word a token,
a BOS with ``add_special``) with ``--tokenize``; a prefix cache (``usage.prompt_tokens_details.cached_tokens``:
the leading 4-word blocks of the prompt that an earlier prompt began with, with ``--cache``); a chat template's
tokens in a chat prompt's count (``--template N``).

Faults on demand (``--fault``): ``http500``, ``not_streaming`` (a JSON answer), ``malformed`` (a data line
that is not JSON), ``truncate`` (the connection closes mid-stream), ``overrun`` (3 tokens past max_tokens),
``no_usage`` (no usage chunk, as llama.cpp streams), ``close`` (the connection closes after each complete
answer while its headers say keep-alive, as llama-server's streams do). A wrong model name gets 404 like vLLM's;
``GET /metrics`` serves vLLM's TTFT and TPOT histograms of what it sent.

Written by hand on an asyncio Protocol with loop timers: the test needs control of every byte and of when
each one leaves, and a server whose own lag stays well under the client's error budget.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS = ("none", "http500", "not_streaming", "malformed", "truncate", "overrun", "no_usage", "close")


@dataclass(frozen=True)
class Script:
    model: str = "fake"
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    per_chunk: int = 1
    fault: str = "none"
    api_key: str = ""  # required as a bearer token when set
    slots: int = 0  # answers streamed at once (0: no limit); the others wait in a FIFO queue
    reasoning: int = 0  # the first tokens of each answer streamed as reasoning
    tool_tokens: int = 0  # the last tokens of each answer streamed as tool-call arguments
    eos_at: int = 0  # answers end after this many tokens unless the request asks ignore_eos (0: never early)
    tokenize: bool = False  # serve llama.cpp's /tokenize and /detokenize
    cache: bool = False  # report the prompt tokens a prefix cache of 4-word blocks would hold
    template: int = 0  # the tokens a chat prompt's template adds to its count
    max_model_len: int = 0  # the context /models names, as vLLM's (0: none named)
    log_prompts: bool = False  # log each request's prompt (chat: its messages) with its receive time


def _head(status: str, ctype: str, length: int | None = None) -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{size}Connection: keep-alive\r\n\r\n".encode()


def _json_answer(status: str, obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    return _head(status, "application/json", len(body)) + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@dataclass
class _Stream:
    """One streamed answer being sent: ``n`` tokens, ``i`` sent so far, the send time of each."""

    conn: _Conn
    chat: bool
    n: int
    prompt_tokens: int
    usage: bool
    t_recv: float
    rid: str = ""
    model: str = "fake"
    cached: int | None = None
    asked: Any = None  # the request's messages (chat) or prompt, logged with ``log_prompts``
    sent: list[float] = field(default_factory=list)
    i: int = 0

    @property
    def head(self) -> str:
        """The fields every event of a real server's stream starts with (AIPerf reads ``object``)."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return f'"id":"cmpl-{self.rid}","object":"{kind}","created":0,"model":"{self.model}"'

    def event(self, **fields: Any) -> bytes:
        return _chunk(b"data: " + ("{" + self.head + "," + json.dumps(fields)[1:]).encode() + b"\n\n")


class _Conn(asyncio.Protocol):
    """One client connection: requests parsed as their bytes arrive (the receive time is stamped then); a
    stream's chunks are sent by loop timers (``call_at``), no task per stream, so that the server's own
    lag stays small at hundreds of streams."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def write(self, data: bytes) -> bool:
        if self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(data)
        return True

    def data_received(self, data: bytes) -> None:
        t_recv = time.monotonic()
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            fields = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            length = int(fields.get("content-length", 0))
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            method, path, _ = head[0].split(" ", 2)
            self.server.seen(method, path, fields)
            if self.server.s.api_key and fields.get("authorization") != f"Bearer {self.server.s.api_key}":
                self.write(_json_answer("401 Unauthorized", {"error": {"message": "bad API key"}}))
                continue
            self.server.answer(self, method, path, body, t_recv, fields.get("x-request-id", ""))


#: the bucket bounds (s) of the fake server's Prometheus histograms (vLLM's names)
BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, float("inf"))


class FakeServer:
    def __init__(self, script: Script, log: Any, headers_log: Any = None) -> None:
        self.s = script
        self.log = log
        self.headers_log = headers_log
        self.loop = asyncio.get_running_loop()
        self.busy = 0  # answers streaming now (``Script.slots``)
        self.waiting: collections.deque[_Stream] = collections.deque()
        self.blocks: set[int] = set()  # the chained hashes of the 4-word prompt blocks seen (``--cache``)
        self.hist: dict[str, list[int]] = {"vllm:time_to_first_token_seconds": [0] * len(BUCKETS),
                                           "vllm:time_per_output_token_seconds": [0] * len(BUCKETS)}

    def seen(self, method: str, path: str, fields: dict[str, str]) -> None:
        """Log a request's method, path and Authorization header (``--headers-log``: what a test checks was sent)."""
        if self.headers_log is not None:
            self.headers_log.write(json.dumps({"method": method, "path": path,
                                               "authorization": fields.get("authorization")}) + "\n")
            self.headers_log.flush()

    def _observe(self, name: str, value: float) -> None:
        counts = self.hist[name]
        for i, le in enumerate(BUCKETS):
            if value <= le:
                counts[i] += 1

    def metrics_text(self) -> bytes:
        lines = []
        for name, counts in self.hist.items():
            lines.append(f"# TYPE {name} histogram")
            for le, n in zip(BUCKETS, counts, strict=True):
                lines.append(f'{name}_bucket{{le="{"+Inf" if le == float("inf") else le}"}} {n}')
            lines.append(f"{name}_count {counts[-1]}")
        return ("\n".join(lines) + "\n").encode()

    def answer(self, conn: _Conn, method: str, path: str, body: bytes, t_recv: float, rid: str = "") -> None:
        s = self.s
        if method == "GET" and path == "/metrics":
            body = self.metrics_text()
            conn.write(_head("200 OK", "text/plain; version=0.0.4", len(body)) + body)
            return
        if method == "GET" and path.endswith("/models"):
            context = {"max_model_len": s.max_model_len} if s.max_model_len else {}
            entry = {"id": s.model, "owned_by": "fake", **context}
            conn.write(_json_answer("200 OK", {"object": "list", "data": [entry]}))
            return
        req = json.loads(body or b"{}")
        if s.tokenize and path in ("/tokenize", "/detokenize"):
            conn.write(_json_answer("200 OK", _tokenize(path, req)))
            return
        if req.get("model") != s.model:
            conn.write(_json_answer("404 Not Found", {"error": {"message": f"The model `{req.get('model')}` "
                                                                           "does not exist.", "code": 404}}))
            return
        if s.fault == "http500":
            conn.write(_json_answer("500 Internal Server Error", {"error": {"message": "scripted failure"}}))
            return
        chat = path.endswith("/chat/completions")
        if s.fault == "not_streaming" or not req.get("stream"):
            words = len((req["messages"][-1]["content"] if chat else req.get("prompt", "")).split())
            usage = {"prompt_tokens": words + s.tokenize + s.template * chat, "completion_tokens": 1}
            conn.write(_json_answer("200 OK", {"choices": [{"text": "hello", "finish_reason": "stop"}],
                                               "usage": usage}))
            return
        want = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        if s.eos_at and not req.get("ignore_eos"):
            want = min(want, s.eos_at)
        # a chat prompt is all its messages' text (a session's turn carries its history)
        prompt = " ".join(str(m.get("content", "")) for m in req["messages"]) if chat else req.get("prompt", "")
        n_prompt = len(prompt.split()) + s.tokenize + s.template * chat  # a BOS with --tokenize
        st = _Stream(conn, chat, want + 3 if s.fault == "overrun" else want, n_prompt,
                     s.fault != "no_usage" and bool((req.get("stream_options") or {}).get("include_usage")), t_recv,
                     rid, s.model, self._cached(prompt.split()) if s.cache else None,
                     (req["messages"] if chat else prompt) if s.log_prompts else None)
        if s.slots and self.busy >= s.slots:
            self.waiting.append(st)
            return
        self._begin(st, t_recv)

    def _cached(self, words: list[str]) -> int:
        """The prompt's words in leading 4-word blocks an earlier prompt began with (then remembered)."""
        h, hit, counting = 0, 0, True
        for i in range(0, len(words) - len(words) % 4, 4):
            h = hash((h, *words[i:i + 4]))
            counting = counting and h in self.blocks
            hit += 4 * counting
            self.blocks.add(h)
        return hit

    def _begin(self, st: _Stream, t0: float) -> None:
        """Start streaming ``st`` in a free slot at ``t0``: its headers now, its first token a TTFT later."""
        self.busy += 1
        st.conn.write(_head("200 OK", "text/event-stream"))
        if st.chat:
            st.conn.write(st.event(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]))
        self.loop.call_at(t0 + self.s.ttft_ms / 1e3, self._step, st)

    def _step(self, st: _Stream) -> None:
        s = self.s
        if s.fault == "truncate" and st.i >= st.n // 2:
            if st.conn.transport is not None:
                st.conn.transport.abort()
            self._log(st)
            return
        if s.fault == "malformed" and st.i > 0:
            st.conn.write(_chunk(b"data: {not json\n\n"))
            self._finish(st)
            return
        k = min(s.per_chunk, st.n - st.i)
        text = "".join(f" t{st.i + j}" for j in range(k))
        # the event written by hand, not json.dumps: the cheapest per chunk (the text is plain ASCII)
        piece = f'"delta":{{"content":"{text}"}}' if st.chat else f'"text":"{text}"'
        if st.chat and st.i < s.reasoning:
            piece = f'"delta":{{"reasoning_content":"{text}"}}'
        elif st.chat and st.i >= st.n - s.tool_tokens:
            piece = f'"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":"{text}"}}}}]}}'
        data = f'{{{st.head},"choices":[{{"index":0,{piece},"finish_reason":null}}]}}'
        t = time.monotonic()
        if not st.conn.write(_chunk(b"data: " + data.encode() + b"\n\n")):
            self._log(st)
            return
        st.sent.extend([t] * k)
        st.i += k
        if st.i < st.n:
            self.loop.call_at(t + s.itl_ms * k / 1e3, self._step, st)
        else:
            self._finish(st)

    def _finish(self, st: _Stream) -> None:
        end = {"index": 0, "delta": {}, "finish_reason": "length"} if st.chat else \
            {"index": 0, "text": "", "finish_reason": "length"}
        st.conn.write(st.event(choices=[end]))
        if st.usage:
            usage = {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.i,
                     "total_tokens": st.prompt_tokens + st.i}
            if st.cached is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": st.cached}
            st.conn.write(st.event(choices=[], usage=usage))
        st.conn.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        if st.sent:
            self._observe("vllm:time_to_first_token_seconds", st.sent[0] - st.t_recv)
            if len(st.sent) > 1:
                self._observe("vllm:time_per_output_token_seconds", (st.sent[-1] - st.sent[0]) / (len(st.sent) - 1))
        self._log(st, done=True)
        if self.s.fault == "close" and st.conn.transport is not None:
            st.conn.transport.close()

    def _log(self, st: _Stream, done: bool = False) -> None:
        """Log a stream that ended (sent, cut off or failed) and hand its slot to the next one waiting."""
        self.busy -= 1
        if self.waiting:
            self._begin(self.waiting.popleft(), time.monotonic())
        entry = {"rid": st.rid, "recv": st.t_recv, "tokens": st.sent, "n": st.i, "done": done}
        if st.asked is not None:
            entry["asked"] = st.asked
        self.log.write(json.dumps(entry) + "\n")


def _tokenize(path: str, req: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's /tokenize (a word a token: its index in the text's words, a BOS of -1 with ``add_special``) and
    /detokenize (token i: the word ``w{i}``; the vocabulary is the text's own, so a cut keeps its words)."""
    if path == "/tokenize":
        words = str(req.get("content", "")).split()
        _WORDS.update({hash(w) & 0xFFFFFF: w for w in words})
        return {"tokens": [-1] * bool(req.get("add_special")) + [hash(w) & 0xFFFFFF for w in words]}
    return {"content": " ".join(_WORDS.get(int(t), "?") for t in req.get("tokens", []) if int(t) >= 0)}


_WORDS: dict[int, str] = {}  # the fake tokenizer's vocabulary: every word it has tokenized, by id


async def _serve(args: argparse.Namespace) -> None:
    script = Script(model=args.model, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, per_chunk=args.per_chunk,
                    fault=args.fault, api_key=args.api_key, slots=args.slots, reasoning=args.reasoning,
                    tool_tokens=args.tool_tokens, eos_at=args.eos_at, tokenize=args.tokenize, cache=args.cache,
                    template=args.template, max_model_len=args.max_model_len, log_prompts=args.log_prompts)
    with open(args.log, "w", buffering=1 << 20) if args.log else open(os.devnull, "w") as log, \
            open(args.headers_log, "w") if args.headers_log else contextlib.nullcontext() as headers_log:
        server = FakeServer(script, log, headers_log)
        srv = await asyncio.get_running_loop().create_server(lambda: _Conn(server), "127.0.0.1", args.port,
                                                             backlog=1024)
        print(f"PORT {srv.sockets[0].getsockname()[1]}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with srv:
            await stop.wait()
        log.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", default="fake")
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--per-chunk", type=int, default=1)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--log", default="")
    p.add_argument("--api-key", default="")
    p.add_argument("--headers-log", default="", help="log each request's method, path and Authorization header here")
    p.add_argument("--slots", type=int, default=0, help="answers streamed at once (0: no limit)")
    p.add_argument("--max-model-len", type=int, default=0, help="the context /models names (0: none)")
    p.add_argument("--cpus", default="", help="pin to these CPUs, e.g. 1")
    p.add_argument("--reasoning", type=int, default=0, help="the first N tokens of each chat answer as reasoning")
    p.add_argument("--tool-tokens", type=int, default=0, help="the last N tokens of each chat answer as a tool call")
    p.add_argument("--eos-at", type=int, default=0, help="end answers after N tokens unless asked ignore_eos")
    p.add_argument("--tokenize", type=lambda v: v == "True", default=False, help="serve llama.cpp's /tokenize")
    p.add_argument("--cache", type=lambda v: v == "True", default=False, help="report prefix-cache hits in usage")
    p.add_argument("--template", type=int, default=0, help="tokens a chat template adds to a prompt's count")
    p.add_argument("--log-prompts", type=lambda v: v == "True", default=False,
                   help="log each request's messages (chat) or prompt as 'asked'")
    args = p.parse_args()
    if args.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    asyncio.run(_serve(args))  # asyncio's loop: its time() is time.monotonic(), the clock the log is in


@contextlib.contextmanager
def fake_server(log: Path | None = None, cpus: str = "", headers_log: Path | None = None,
                **script: Any) -> Iterator[str]:
    """Run the fake server in its own process; yields its ``http://127.0.0.1:PORT``. ``script``: the
    :class:`Script` fields (``ttft_ms``, ``itl_ms``, ``per_chunk``, ``fault``, ``model``); ``headers_log``: a file
    it logs each request's Authorization header to (:func:`read_log` reads it)."""
    argv = [sys.executable, "-m", "tests.fake_openai", "--log", str(log or ""), "--cpus", cpus,
            "--headers-log", str(headers_log or "")]
    for key, value in script.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the fake OpenAI server did not start (exit {proc.poll()})")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def word_tokenizer(folder: Path, words: tuple[str, ...] = ()) -> Path:
    """A word-level Hugging Face tokenizer (``tokenizer.json`` in ``folder``) that knows the fake server's
    tokens (``t0``..``t4095``) and ``words``, one token each: the exact count of what the fake sends."""
    from tokenizers import Tokenizer  # noqa: PLC0415 - the tests' optional tokenizer library
    from tokenizers.models import WordLevel  # noqa: PLC0415 - idem
    from tokenizers.pre_tokenizers import Whitespace  # noqa: PLC0415 - idem

    vocab = {w: i for i, w in enumerate(["[UNK]", *dict.fromkeys(words), *[f"t{i}" for i in range(4096)]])}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def read_log(path: Path) -> list[dict[str, Any]]:
    """The fake server's per-request truth: ``rid`` (the X-Request-Id header), ``recv`` (s), ``tokens`` (send
    time of each token, s), ``n`` tokens
    sent, ``done``: the stream was sent to its end (not cut off by the client or a fault); ``asked``: its messages
    (chat) or prompt, with ``log_prompts``."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()

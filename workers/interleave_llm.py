"""The LLM side of an interleaved compare (``workers.interleave``): a model served by its engine's own server
(``Runner.serve``: the launch its card declares, jailed and pinned to the compare's core lease like a job's
server), driven one streamed request per call over a keep-alive connection per client thread.

The prompts are the job's own workload (``workers.loadgen.openai.workload``: exact lengths by the server's
tokenizer where it has a tokenize route, each request salted so no two share a prefix), built once from side A's
server and sent to both, so both sides answer the same prompts; ``ignore_eos`` is sent where the server takes it,
so each answer has the length asked. The stream is read by the load client's own parser and accounting
(``workers.loadgen.openai.stream``), so TTFT and token counts mean what they mean in a job's row.
"""
from __future__ import annotations

import http.client
import itertools
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from farm.errors import LoadGenError
from schemas import JobSpec
from schemas.llm import LlmSettings
from workers.interleave import Reply
from workers.loadgen.openai.request import probe, request_body
from workers.loadgen.openai.server_tokenizer import server_tokenizer
from workers.loadgen.openai.stream import RawRequest, account, close_stream, feed_line
from workers.loadgen.openai.workload import Prompt, Salts, synthetic_prompts
from workers.runners.base import Runner

#: one streamed request's longest wait for its next bytes, s
READ_TIMEOUT_S = 120.0


@dataclass
class Workload:
    """The prompts both sides are sent (built from the first side's server), their salts and whether the servers
    take ``ignore_eos``."""

    prompts: list[Prompt]
    salts: Salts
    ignore_eos: bool


class ServedSide:
    """One model served for the compare (``spec``: the job it would be; ``runner``: who places its server on
    ``cores``); ``workload`` is shared with the other side (the first side to open builds it)."""

    def __init__(self, model: Path, spec: JobSpec, runner: Runner, cores: list[int], shared: list[Workload]) -> None:
        self.model = model
        self.spec = spec
        self.runner = runner
        self.cores = cores
        self.shared = shared
        self.signature: list[tuple[str, str, tuple[int, ...]]] = []  # an LLM takes text: both sides alike
        self._stack = ExitStack()
        self._local = threading.local()
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._host = ""
        self._port = 0
        self._model_name = ""

    @property
    def llm(self) -> LlmSettings:
        assert self.spec.measurement.llm is not None, "an LLM job's spec has its llm settings"
        return self.spec.measurement.llm

    def open(self, warmup_s: float) -> None:
        """Start the server (ready when it answers a completion), build or take the prompts, warm it for
        ``warmup_s`` (at least one request)."""
        try:
            target = self._stack.enter_context(self.runner.serve(self.spec, self.model, set(self.cores)))
            self._host, self._port, self._model_name = target.host, target.port, target.model_name
            if not self.shared:
                self.shared.append(self._workload(f"http://{target.url}"))
        except BaseException:
            self._stack.close()
            raise
        end = time.perf_counter() + warmup_s
        self.call()
        while time.perf_counter() < end:
            self.call()

    def _workload(self, root: str) -> Workload:
        base = root + self.llm.base_path
        tok = server_tokenizer(root, self._model_name)
        salts = Salts.of(tok).started()
        said = probe(base, self.llm.api, self._model_name, None, None)
        return Workload(synthetic_prompts(self.llm, tok, salts=salts), salts, said.ignore_eos)

    def call(self) -> Reply:
        """One streamed request; its TTFT and output tokens. LoadGenError (one line, the server's words) when it
        fails: a compare never judges a side on its errors."""
        work = self.shared[0]
        seq = next(self._seq)
        prompt = work.prompts[seq % len(work.prompts)]
        body = request_body(self.llm.api, self._model_name, prompt, work.ignore_eos, work.salts.salt(seq))
        path = self.llm.base_path + ("/chat/completions" if self.llm.api == "openai-chat" else "/completions")
        rec = RawRequest(scheduled=0.0, sent=0.0, warm=False, prompt_tokens=prompt.input_tokens,
                         prompt_source=prompt.input_source, max_tokens=prompt.max_tokens)
        try:
            try:
                self._stream(path, body, rec)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._local.conn = None  # a kept-alive connection the server had closed (llama-server does after
                self._stream(path, body, rec)  # each stream) before any byte of the answer: sent again, fresh
        except (OSError, http.client.HTTPException) as exc:
            self._local.conn = None
            raise LoadGenError(f"{self.model.name}: a streamed request failed ({type(exc).__name__}: {exc})") from None
        if rec.error is not None:
            raise LoadGenError(f"{self.model.name}: {rec.error_text or rec.error}")
        outcome = account(rec, None)
        return Reply(ttft_s=outcome.ttft_ms / 1e3, tokens=outcome.output_tokens)

    def _stream(self, path: str, body: bytes, rec: RawRequest) -> None:
        """Send ``body`` on this thread's connection and read its event stream into ``rec``."""
        conn = self._conn()
        rec.scheduled = rec.sent = time.perf_counter()
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                       "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read(2048).decode(errors="replace")
            rec.fail(f"HTTP_{resp.status}", f"HTTP {resp.status}: {' '.join(text.split())[:200]}", time.perf_counter())
            return
        while line := resp.readline():
            if feed_line(rec, line, time.perf_counter()):
                break
        close_stream(rec, time.perf_counter())
        resp.read()  # the rest of the body (after [DONE]), so the connection can be reused

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=READ_TIMEOUT_S)
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def close(self) -> None:
        """Close the client's connections and stop the server (the runner frees its port)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
        self._stack.close()

"""The OpenAI streaming load loop: one asyncio event loop in a process of its own, pinned to the caller's
CPUs (a job's load-generator cores), sending chat or completion requests with ``stream: true``. Each read of
a response is stamped with ``time.monotonic()`` at the entry of its connection's protocol callback and kept
unparsed; the server-sent events are parsed after the run.

HTTP stack: farm's own minimal HTTP/1.1 client on an asyncio Protocol (``http_stream``: why not aiohttp is
said there) on uvloop (asyncio's own loop where uvloop is missing). One keep-alive connection per closed-loop
slot, as many as there are requests in flight in open loop: no pool cap to hide queueing behind. The task of a
request wakes once, when its response has ended, not per chunk. Measured with ``benchmarks/llm_client.py``
against a fake server that logs its per-token send times: see docs/llm.md for the figures at concurrency 1,
64 and 256 on 2 cores. A separate process keeps the job's samplers and the coordinator off this loop and its
GIL, as farm's gRPC generator does; Python's cyclic garbage collector is off while the load runs (a full
collection stalls the loop for milliseconds).

Closed loop: ``concurrency`` tasks, each sending its next request as soon as the last one ended. Open loop:
requests at the pattern's send times whatever is in flight; latency counts from the scheduled time, and a
send that leaves over ``LATE_S`` after it is late (coordinated omission is visible, never hidden). A sessions
workload (``sessions``: prompts with a ``turn``) sends whole sessions in place of requests: a closed-loop slot runs
one session after another, an open-loop send time starts one, and its turns follow in order with their history.
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import os
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from workers.loadgen.drivers import process_context, reap, start
from workers.loadgen.openai.http_stream import Lost, Pool, ProtocolError, Reply, TooLarge
from workers.loadgen.openai.models_api import headers
from workers.loadgen.openai.request import body_parts, salt_bytes
from workers.loadgen.openai.saturation import SAMPLE_S
from workers.loadgen.openai.sessions import SessionRunner, split_sessions
from workers.loadgen.openai.stream import (
    BAD_HTTP,
    CONNECT_ERROR,
    NOT_STREAMING,
    TIMEOUT,
    TRUNCATED,
    RawRequest,
    replay,
)
from workers.loadgen.openai.workload import WORDS, Prompt, Salts
from workers.loadgen.patterns import LoadPattern
from workers.loadgen.plan import WindowPlan
from workers.loadgen.stops import Progress, StopRule, end_s

LATE_S = 0.001  # an open-loop send leaving more than 1 ms after its schedule is late
WAKE_LEAD_S = 0.00075  # wake this early: timers fire up to ~1 ms late
START_DELAY_S = 0.05  # between the parent's go and the schedule's start
GO_TIMEOUT_S = 60.0  # how long the load process may take to start (a fresh fork server imports first)
READY = "ready"  # what the load process says once it can start
LAG_PROBE_S = 0.005  # the period of the loop-lag probe
DRAIN_S = 1.0  # after [DONE], how long the rest of a response may take to arrive (keeps the connection reusable)
IN_FLIGHT_CAP = "IN_FLIGHT_CAP"  # an open-loop send not made: the job's cap on requests in flight was reached
TOO_LARGE = "RESPONSE_TOO_LARGE"  # a response body over the cap (FARM_MAX_RESPONSE_BYTES): read no further


@dataclass(frozen=True)
class HttpJob:
    """What the load process sends: the ``api`` (``openai-chat``/``openai-completions``) at ``base_url``
    for ``model``, the prompts in turn, the pattern through the plan; ``stops``: when the run ends (``stops``;
    none: at the plan's end); ``warmup_requests`` first sends left out. ``authority``: the
    endpoint's name (Host header, TLS) where ``base_url`` holds the address it was pinned to; ``max_in_flight``: an
    endpoint job's cap on requests in flight (an open-loop send past it is not made and counts as an error);
    ``max_response_bytes``: the most of one response body read. The API key is not here: the caller reads the
    operator's credential when the run starts and hands it to the load process through its pipe, never stored."""

    base_url: str
    api: str
    model: str
    prompts: tuple[Prompt, ...]
    pattern: LoadPattern
    plan: WindowPlan
    authority: str | None = None
    max_in_flight: int | None = None
    max_response_bytes: int = 32 << 20
    stops: tuple[StopRule, ...] = ()
    warmup_requests: int = 0
    request_timeout_s: float = 600.0
    seed: int = 0
    salts: Salts = Salts(tuple(WORDS))  # each request's salt (``workload.Salts``), from a start of the run's own
    ignore_eos: bool = False  # ask the server to run to max_tokens (vLLM's and llama.cpp's ``ignore_eos``)
    think_s: float = 0.0  # sessions: the time between an answer and the session's next turn


@dataclass
class HttpRun:
    """What the load process measured: every request that ended (complete or failed) in send order, the sends,
    late sends, requests still in flight at the stop, the process's CPU busy % over the run, when the
    schedule started (monotonic s) and whether uvloop ran it."""

    records: list[RawRequest] = field(default_factory=list)
    cut: list[RawRequest] = field(default_factory=list)  # in flight at the stop: what they had received by then
    sent: int = 0
    late: int = 0
    in_flight: int = 0
    busy_pct: float = 0.0
    t_start: float = 0.0
    loop: str = "asyncio"
    loop_lag_ms: list[float] = field(default_factory=list)  # how late a 5 ms timer of the loop woke, each time
    # the measured requests still in flight at the stop: (age, time to their first chunk or None), ms
    unfinished: list[tuple[float, float | None]] = field(default_factory=list)
    oversaturated: str | None = None  # why a rule ending the span (over-saturation) stopped the run (None: none did)
    stopped_at: float | None = None  # when it was stopped early (monotonic s; None: at its plan's end)


def request_seq(request_id: str) -> int:
    """The request's number in its run from the X-Request-Id farm sent (a UUID whose last group holds it)."""
    return int(request_id.rsplit("-", 1)[1], 16)


def route(api: str) -> str:
    return "/chat/completions" if api == "openai-chat" else "/completions"


class _Loop:
    """The traffic of one :class:`HttpJob` on the running loop."""

    def __init__(self, job: HttpJob, pool: Pool, key: str | None, t_start: float) -> None:
        self.job, self.pool, self.t_start = job, pool, t_start
        self.route = route(job.api)
        self.headers = list(headers(key).items())
        self.bodies = [body_parts(job.api, job.model, p, job.ignore_eos) for p in job.prompts]
        self.salts = job.salts.started()
        self.next = itertools.cycle(range(len(job.prompts))).__next__
        self.warm_end = t_start + job.plan.warmup_s
        self.out = HttpRun(t_start=t_start)
        self.measured_done = 0
        self.stop = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.live: dict[int, RawRequest] = {}  # sent and not ended, by number
        self.first_ms: list[tuple[float, float]] = []  # (arrival, ms since scheduled) of each first chunk seen
        self._first_seen: set[int] = set()  # the numbers of the requests in ``first_ms``
        # X-Request-Id is a UUID: llama-cpp-python's server answers 400 to any other form; the run in its high
        # bits, the request's number in its last 48 (the last group of the written form: see request_seq)
        self.run_id = uuid.uuid4().int >> 48 << 48
        self.on_end = [r for r in job.stops if not r.sampled]  # judged as each request ends
        self.on_tick = [r for r in job.stops if r.sampled]  # judged on the in-flight sampler's ticks
        self.in_flight: list[tuple[float, float]] = []  # (monotonic s, requests in flight), sampled
        self.sends_over = False  # a finite schedule (a trace's) has made its last send: stop once all have ended
        sessions = split_sessions(job.prompts)
        self.sessions = SessionRunner(sessions, job.api, job.model, job.ignore_eos, job.think_s, self.salts, self._rec,
                                      self._one, self.stop) if sessions else None

    def _new(self, scheduled: float, sent: float) -> tuple[RawRequest, bytes]:
        i = self.next()
        p = self.job.prompts[i]
        rec = self._rec(scheduled, sent, p, p.input_tokens)
        head, tail = self.bodies[i]
        return rec, head + salt_bytes(p, self.salts.salt(rec.seq)) + tail

    def _rec(self, scheduled: float, sent: float, p: Prompt, prompt_tokens: int) -> RawRequest:
        """The record of the run's next send, of prompt ``p`` meant to hold ``prompt_tokens`` (a session's turn: its
        history's too)."""
        self.out.sent += 1
        warm = self.out.sent <= self.job.warmup_requests or scheduled < self.warm_end
        return RawRequest(scheduled=scheduled, sent=sent, warm=warm, prompt_tokens=prompt_tokens,
                          prompt_source=p.input_source, max_tokens=p.max_tokens, seq=self.out.sent, turn=p.turn)

    def _start(self, scheduled: float, sent: float) -> Coroutine[Any, Any, None]:
        """One request scheduled at ``scheduled`` or, in a sessions workload, one session starting then."""
        if self.sessions is not None:
            return self.sessions.run(scheduled, sent)
        return self._one(*self._new(scheduled, sent))

    @staticmethod
    def _check(rec: RawRequest, reply: Reply) -> None:
        """Fail a response that is an HTTP error or not an event stream."""
        if reply.status >= 400:
            text = b"".join(p for _, p in rec.pieces)[:200].decode(errors="replace").replace("\n", " ")
            rec.fail(f"HTTP_{reply.status}", f"HTTP {reply.status}: {text}", reply.end)
            return
        ctype = reply.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            rec.fail(NOT_STREAMING, f"{NOT_STREAMING}: the server answered {ctype or 'no content type'}, not "
                                    "an event stream; it does not stream this API", reply.end)

    async def _exchange(self, rec: RawRequest, body: bytes) -> None:
        """Send one request and wait for its response's end (the connection stamps and keeps each read).
        Errors are counted on ``rec``. A request whose reused keep-alive connection the server had already closed
        (it ended before any byte of an answer: llama-server closes its connection after each stream while its
        headers say keep-alive, and the close can reach us only after the next request went out) is sent once
        more, on a new connection, as HTTP clients do (RFC 9112, 9.3.1)."""
        if await self._attempt(rec, body, fresh=False):
            await self._attempt(rec, body, fresh=True)

    async def _attempt(self, rec: RawRequest, body: bytes, fresh: bool) -> bool:
        """One send of ``rec`` (``fresh``: on a new connection); True when it should be sent again (see
        ``_exchange``), else its outcome is on ``rec``."""
        now = time.monotonic
        try:
            conn = await self.pool.acquire(fresh)
        except (OSError, TimeoutError) as exc:
            rec.fail(CONNECT_ERROR, f"{CONNECT_ERROR}: cannot connect to {self.pool.authority}: "
                                    f"{type(exc).__name__}: {exc}", now())
            return False
        reusable, reused = False, conn.answered > 0
        # X-Request-Id: the request's number in this run, as many servers log it (vLLM takes it as its id)
        data = self.pool.request_bytes(self.route, body, [
            *self.headers, ("X-Request-Id", str(uuid.UUID(int=self.run_id | rec.seq)))])
        try:
            waiter = conn.send(data, rec.pieces)
            rec.wrote = now()  # the request is in the socket: its lag behind the schedule is the client's own
            async with asyncio.timeout(self.job.request_timeout_s):
                reply = await waiter
            rec.eof, reusable = reply.end, reply.keep_alive
            self._check(rec, reply)
        except TimeoutError:
            rec.fail(TIMEOUT, f"{TIMEOUT}: no end within {self.job.request_timeout_s:g} s", now())
        except Lost as exc:
            if reused and not exc.started and not rec.pieces:
                return True
            name = TRUNCATED if exc.started else CONNECT_ERROR
            rec.fail(name, f"{name}: {exc}", now())
        except TooLarge as exc:
            rec.fail(TOO_LARGE, f"{TOO_LARGE}: {exc}", now())
        except ProtocolError as exc:
            rec.fail(BAD_HTTP, f"{BAD_HTTP}: {exc}", now())
        finally:
            rec.first_byte = conn.first_byte
            self.pool.release(conn, reusable)
        return False

    async def _one(self, rec: RawRequest, body: bytes) -> None:
        self.live[rec.seq] = rec
        await self._exchange(rec, body)
        self._done(rec)

    def _note_first(self, rec: RawRequest) -> None:
        """Add ``rec``'s first chunk (stamped by the connection as it arrived) to ``first_ms``, once."""
        if rec.pieces and rec.seq not in self._first_seen:
            self._first_seen.add(rec.seq)
            self.first_ms.append((rec.pieces[0][0], (rec.pieces[0][0] - rec.scheduled) * 1e3))

    def _done(self, rec: RawRequest) -> None:
        self.live.pop(rec.seq, None)
        if self.on_tick:
            self._note_first(rec)
        self.out.records.append(rec)
        if self.sends_over and len(self.out.records) == self.out.sent:
            self.stop.set()
        if not rec.warm and rec.error is None:
            self.measured_done += 1
            self._judge(self.on_end, time.monotonic())

    def _judge(self, rules: list[StopRule], now: float) -> None:
        """Stop the run when one of ``rules`` says so at ``now`` (monotonic s); a rule ending the span records
        why and when."""
        progress = Progress(now=now, t_start=self.t_start, warmup_s=self.job.plan.warmup_s,
                            measured_done=self.measured_done, in_flight=self.in_flight, first_ms=self.first_ms)
        for rule in rules:
            why = rule.should_stop(progress)
            if why is not None:
                if rule.ends_span:
                    self.out.oversaturated, self.out.stopped_at = why, now
                self.stop.set()
                return

    async def _slot(self) -> None:
        now = time.monotonic
        while not self.stop.is_set():
            t = now()
            await self._start(t, t)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _open(self, send_times: Iterator[float]) -> None:
        now = time.monotonic
        for t in send_times:
            await asyncio.sleep(max(t - WAKE_LEAD_S - now(), 0.0))
            if self.stop.is_set():
                return
            sent = now()
            if sent - t > LATE_S:
                self.out.late += 1
            if self.job.max_in_flight is not None and len(self.live) >= self.job.max_in_flight:
                rec, _ = self._new(t, min(t, sent))  # not sent: counted against the run, never queued unbounded
                rec.fail(IN_FLIGHT_CAP, f"{IN_FLIGHT_CAP}: {self.job.max_in_flight} requests already in flight "
                                        "(FARM_ENDPOINT_MAX_IN_FLIGHT)", sent)
                self._done(rec)
                continue
            self._spawn(self._start(t, min(t, sent)))
        self.sends_over = True
        if len(self.out.records) == self.out.sent:
            self.stop.set()

    async def _watch_lag(self) -> None:
        """The loop's own lateness: a timer every ``LAG_PROBE_S``, and how late it woke (ms). What delays it
        (this process's work, or a host that leaves it waiting for a CPU) delays every chunk's stamp too."""
        now = time.monotonic
        while not self.stop.is_set():
            t = now()
            await asyncio.sleep(LAG_PROBE_S)
            self.out.loop_lag_ms.append((now() - t - LAG_PROBE_S) * 1e3)

    async def _sample(self) -> None:
        """Sample the requests in flight (and the first chunks seen) every ``SAMPLE_S`` and judge the sampled stop
        rules (over-saturation: ``saturation.OverSaturation``)."""
        now = time.monotonic
        while not self.stop.is_set():
            await asyncio.sleep(SAMPLE_S)
            t = now()
            self.in_flight.append((t, float(len(self.live))))
            for rec in list(self.live.values()):  # first chunks arrive in the connection's callback: read them here
                self._note_first(rec)
            self._judge(self.on_tick, t)

    def _unfinished(self, t: float) -> list[tuple[float, float | None]]:
        """The measured requests in flight at ``t``: their age and time to their first chunk (None: none yet), ms."""
        return [((t - r.scheduled) * 1e3, (r.pieces[0][0] - r.scheduled) * 1e3 if r.pieces else None)
                for r in self.live.values() if not r.warm]

    def closed_loop(self, slots: int) -> None:
        for _ in range(slots):
            self._spawn(self._slot())

    def open_loop(self, send_times: Iterator[float]) -> None:
        self._spawn(self._open(send_times))

    async def run(self) -> HttpRun:
        job = self.job
        end = self.t_start + end_s(job.stops, job.plan.span_s)
        await asyncio.sleep(max(self.t_start - time.monotonic(), 0.0))
        cpu0, wall0 = time.process_time(), time.monotonic()
        job.pattern.start(self, self.t_start, job.seed)
        self._spawn(self._watch_lag())
        if self.on_tick:
            self._spawn(self._sample())
        try:
            await asyncio.wait_for(self.stop.wait(), max(end - time.monotonic(), 0.0))
        except TimeoutError:
            pass
        self.stop.set()
        self.out.unfinished = self._unfinished(time.monotonic())
        self.out.busy_pct = 100.0 * (time.process_time() - cpu0) / max(time.monotonic() - wall0, 1e-9)
        pending = list(self.tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self.out.in_flight = self.out.sent - len(self.out.records)
        stop = time.monotonic()
        for rec in self.live.values():  # their tokens so far count in the token rate of the run's last window
            rec.eof = stop
            self.out.cut.append(rec)
        for rec in (*self.out.records, *self.out.cut):
            replay(rec)
        return self.out


async def _main(job: HttpJob, t_start: float, key: str | None) -> HttpRun:
    pool = Pool(job.base_url, connect_timeout_s=min(job.request_timeout_s, 10.0), drain_s=DRAIN_S,
                authority=job.authority, max_body=job.max_response_bytes)
    try:
        return await _Loop(job, pool, key, t_start).run()
    finally:
        pool.close()


def loop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """uvloop's event loop where installed (cheaper per chunk), else asyncio's."""
    try:
        import uvloop  # noqa: PLC0415 - optional (the llm extra); the load process only
    except ImportError:
        return None, "asyncio"
    return uvloop.new_event_loop, "uvloop"


def run_http(job: HttpJob, t_start: float, key: str | None = None) -> HttpRun:
    """Run ``job`` to its end on a fresh event loop of this thread (``key``: the API key; None: none)."""
    factory, name = loop_factory()
    gc.collect()
    gc.freeze()  # what exists now is never scanned again
    gc.disable()  # no collection pauses while the load runs (the run's records hold no cycles)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            out = runner.run(_main(job, t_start, key))
    finally:
        gc.enable()
        gc.unfreeze()
    out.loop = name
    return out


def _child(job: HttpJob, conn: Connection, cpus: set[int] | None) -> None:
    """The load process: report ready (imports done), take the schedule's start time, run, send the run."""
    import signal  # noqa: PLC0415 - the child's own setup
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process
    if cpus:
        os.sched_setaffinity(0, cpus)
    loop_factory()  # import uvloop before saying ready
    conn.send(READY)
    if not conn.poll(GO_TIMEOUT_S):
        return
    t_start, key = conn.recv()  # the key comes from the caller (the operator's credential, read for this run)
    try:
        conn.send(run_http(job, t_start, key))
    except Exception as exc:  # reported to the parent, which raises LoadGenError
        conn.send(f"the OpenAI load process failed: {type(exc).__name__}: {exc}")
    conn.close()


Waiter = Callable[[float], "HttpRun | str | None"]


@contextmanager
def load_process(job: HttpJob, key: str | None = None,
                 start_timeout_s: float = GO_TIMEOUT_S) -> Iterator[tuple[Waiter, float | None]]:
    """Start the load process on this thread's CPUs and, once it is ready, its schedule (``key``: the API key,
    sent through the pipe only); yields ``wait(timeout_s)`` (its :class:`HttpRun`, an error text, or None when it
    did not finish in time) and the schedule's start (monotonic s; None when the process did not start). The
    process is always reaped."""
    ctx = process_context()
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_child, args=(job, child, cpus), name="farm-openai-load", daemon=True)
    start(proc)  # its CPU time is the job's own, not foreign load on the job's cores
    child.close()

    def wait(timeout_s: float) -> HttpRun | str | None:
        if not parent.poll(timeout_s):
            return None
        try:
            got: HttpRun | str = parent.recv()
        except (EOFError, OSError):
            return f"the OpenAI load process exited early (exit code {proc.exitcode})"
        return got

    try:
        ready = wait(start_timeout_s)
        if ready != READY:
            why = ready if isinstance(ready, str) else "the OpenAI load process did not start"
            yield (lambda _timeout_s: why), None
            return
        t_start = time.monotonic() + START_DELAY_S
        parent.send((t_start, key))
        yield wait, t_start
    finally:
        proc.join(5.0)
        reap(proc)
        parent.close()

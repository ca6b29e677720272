"""One load-generating event loop: a grpc.aio channel driving the ModelInfer traffic of a load pattern
(``patterns``: closed loop, or open loop on the pattern's send schedule).

A worker runs in a thread of the caller's process or in its own process (see ``drivers``). It talks to
its coordinator through a :class:`Control` with the messages of ``messages``: it reports ``Ready``, waits
for go (a shared ``time.monotonic()`` start, valid across processes on one machine), then reports a
``WarmupReport`` and one ``WindowReport`` per measurement window, and ``WorkerDone`` when it stopped.
Times are monotonic seconds; latencies milliseconds.
"""
from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from workers.engines.base import COMPUTE_PARAM, QUEUE_PARAM
from workers.loadgen.kserve.messages import (
    Ready,
    Samples,
    WarmupReport,
    WindowReport,
    WorkerDone,
    WorkerError,
    WorkerMessage,
)
from workers.loadgen.patterns import LoadPattern
from workers.loadgen.plan import WindowPlan

MAX_MESSAGE_BYTES = -1  # unlimited send/receive message size
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
]
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
LATE_S = 0.001  # an open-loop send leaving more than 1 ms after its schedule is late
WAKE_LEAD_S = 0.00075  # wake this early: asyncio timers fire up to ~1 ms late (epoll's ms resolution)
STOP_POLL_S = 0.01  # how often the worker checks for a stop request
BACKLOG_STATUS = "CLIENT_BACKLOG"  # open loop: a send skipped because max_outstanding were in flight
STREAM_ERROR_STATUS = "STREAM_ERROR"  # a stream response's error_message without a status name
STREAM_CLOSED_STATUS = "STREAM_CLOSED"  # the server ended a stream while requests were outstanding
STREAM_CLOSED_TEXT = f"{STREAM_CLOSED_STATUS}: the server ended the stream"


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker sends: ``pattern`` (this worker's share of the job's, ``LoadPattern.split``) through
    ``plan``'s warm-up and windows.

    Closed loop: one call (stream RPC: one stream) per outstanding request. Open loop: at most
    ``max_outstanding`` in flight (sends beyond are counted as errors); stream RPC: one stream, responses
    matched to requests by their ``id``.
    """

    url: str
    model_name: str
    request: bytes
    pattern: LoadPattern
    plan: WindowPlan
    connect_timeout_s: float = 10.0
    seed: int = 0
    max_outstanding: int = 10000
    check_ready: bool = True
    rpc: str = "unary"  # "unary": one ModelInfer call per request; "stream": ModelStreamInfer messages
    more_requests: tuple[bytes, ...] = ()  # sent in turn after ``request`` (a data file's further rows)

    def request_cycle(self) -> Iterator[bytes]:
        """The requests to send, in turn, endlessly: ``request`` then ``more_requests``."""
        return itertools.cycle((self.request, *self.more_requests))


class Control(ABC):
    """The worker's line to its coordinator."""

    @abstractmethod
    def send(self, msg: WorkerMessage) -> None:
        """Report a message to the coordinator."""

    @abstractmethod
    def wait_go(self, timeout_s: float) -> float | None:
        """Block until the coordinator says go; the shared monotonic start time, None on stop/timeout."""

    @abstractmethod
    def stop_requested(self) -> bool:
        """True once the coordinator asked to stop (non-blocking)."""


def _status_name(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        code = exc.code()
        return code.name if code is not None else "UNKNOWN"
    return type(exc).__name__


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "details"):
        return f"{_status_name(exc)}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


_STATUS_NAMES = frozenset(c.name for c in grpc.StatusCode)


def _stream_error_name(text: str) -> str:
    """The status of a stream response's ``error_message``: its "<STATUS>: ..." prefix (as farm's server
    writes it), else STREAM_ERROR (Triton sends the bare error text)."""
    head = text.split(":", 1)[0].strip()
    return head if head in _STATUS_NAMES else STREAM_ERROR_STATUS


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def with_id(request: bytes, request_id: str) -> bytes:
    """The serialized ModelInferRequest ``request`` with its ``id`` (field 3) set to ``request_id``.
    A parser keeps the last value of a singular field that occurs twice, so the field is appended to the
    bytes serialized once (one copy of them per send), not re-encoded with the request."""
    raw = request_id.encode()
    return request + b"\x1a" + _varint(len(raw)) + raw


class LoadWorker:
    """Generates the load of one :class:`WorkerConfig` on the running event loop."""

    def __init__(self, cfg: WorkerConfig, control: Control) -> None:
        self.cfg = cfg
        self.control = control
        self._stopping = False
        self._stop_ev: asyncio.Event | None = None
        # completions, in completion order (monotonic times, so sorted)
        self._t_done: list[float] = []
        self._lat: list[float] = []
        self._queue: list[float] = []
        self._compute: list[float] = []
        self._err_t: list[float] = []
        self._err_name: list[str] = []
        self.first_error: str | None = None
        self._sent = 0
        self._late = 0
        self._infer: Any = None  # the channel's ModelInfer call, once connected
        self._open_stream: Any = None  # opens a ModelStreamInfer stream, once connected
        self._traffic: list[asyncio.Task[None]] = []
        self._sender: _UnarySender | _StreamSender | _ThreadSender | None = None
        # open loop's sender thread records from gRPC's callback threads while the ticker cuts windows
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- recording
    def _record_ok(self, start: float, done: float, resp: pb.ModelInferResponse) -> None:
        with self._lock:
            self._record_ok_locked(start, done, resp)

    def _record_ok_locked(self, start: float, done: float, resp: pb.ModelInferResponse) -> None:
        self._t_done.append(done)
        self._lat.append((done - start) * 1e3)
        params = resp.parameters
        if QUEUE_PARAM in params:
            self._queue.append(params[QUEUE_PARAM].int64_param * 1e-6)
        else:
            self._queue.append(math.nan)
        if COMPUTE_PARAM in params:
            self._compute.append(params[COMPUTE_PARAM].int64_param * 1e-6)
        else:
            self._compute.append(math.nan)

    def _record_msg(self, start: float, done: float, msg: pb.ModelStreamInferResponse) -> None:
        if msg.error_message:
            self._record_err(done, _stream_error_name(msg.error_message), msg.error_message)
        else:
            self._record_ok(start, done, msg.infer_response)

    def _count_late(self, scheduled: float, issued: float) -> None:
        """Count an open-loop send as late when the call was issued more than ``LATE_S`` after its schedule."""
        if issued - scheduled > LATE_S:
            self._late += 1

    def _record_err(self, done: float, name: str, text: str) -> None:
        with self._lock:
            self._err_t.append(done)
            self._err_name.append(name)
            if self.first_error is None:
                self.first_error = text

    def _cut(self, edge: float) -> Samples:
        """Take every completion and error up to ``edge`` out of the buffers."""
        with self._lock:
            return self._cut_locked(edge)

    def _cut_locked(self, edge: float) -> Samples:
        i = bisect.bisect_right(self._t_done, edge)
        lat = np.asarray(self._lat[:i], dtype=np.float64)
        queue = np.asarray(self._queue[:i], dtype=np.float64)
        compute = np.asarray(self._compute[:i], dtype=np.float64)
        del self._t_done[:i], self._lat[:i], self._queue[:i], self._compute[:i]
        j = bisect.bisect_right(self._err_t, edge)
        errors: dict[str, int] = {}
        for name in self._err_name[:j]:
            errors[name] = errors.get(name, 0) + 1
        del self._err_t[:j], self._err_name[:j]
        sent, late = self._sent, self._late
        self._sent = self._late = 0
        return Samples(lat_ms=lat, queue_ms=queue[~np.isnan(queue)], compute_ms=compute[~np.isnan(compute)],
                       errors=errors, sent=sent, late=late)

    # ----------------------------------------------------------------- traffic
    async def _closed_loop(self, infer: Any) -> None:
        reqs = self.cfg.request_cycle()
        now = time.monotonic
        while not self._stopping:
            self._sent += 1
            t0 = now()
            try:
                resp = await infer(next(reqs))
            except grpc.RpcError as exc:
                if self._stopping:
                    return
                self._record_err(now(), _status_name(exc), _describe(exc))
                continue
            self._record_ok(t0, now(), resp)

    async def _closed_stream(self, open_stream: Any) -> None:
        """One closed-loop slot on its own stream: write a request, read its answer, repeat; a broken
        stream is counted as one error and replaced."""
        reqs = self.cfg.request_cycle()
        now = time.monotonic
        while not self._stopping:
            call = open_stream()
            try:
                while not self._stopping:
                    self._sent += 1
                    t0 = now()
                    await call.write(next(reqs))
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        self._record_err(now(), STREAM_CLOSED_STATUS, STREAM_CLOSED_TEXT)
                        break
                    self._record_msg(t0, now(), msg)
            except (grpc.RpcError, asyncio.InvalidStateError) as exc:
                if self._stopping:
                    return
                self._record_err(now(), _status_name(exc), _describe(exc))
            finally:
                call.cancel()

    async def _open_loop(self, sender: _UnarySender | _StreamSender, send_times: Iterator[float]) -> None:
        cfg = self.cfg
        now = time.monotonic
        for t in send_times:
            delay = t - WAKE_LEAD_S - now()
            # behind schedule: still yield once, so the calls sent so far start and answers are read
            await asyncio.sleep(max(delay, 0.0))
            if self._stopping:
                return
            sent_at = now()
            self._sent += 1
            if sender.outstanding() >= cfg.max_outstanding:
                self._count_late(t, sent_at)
                self._record_err(sent_at, BACKLOG_STATUS,
                                 f"{BACKLOG_STATUS}: {cfg.max_outstanding} requests already in flight")
            else:
                # latency counts from the schedule (a stall delays the schedule, not the clock) or from
                # the actual send when it left a little early; the sender counts a late send when the
                # call actually starts
                await sender.send(t, sent_at)

    # ----------------------------------------------------------------- traffic of a pattern (patterns.Traffic)
    def closed_loop(self, slots: int) -> None:
        """Start ``slots`` closed-loop tasks, one call or stream each."""
        if self.cfg.rpc == "stream":
            self._traffic = [asyncio.create_task(self._closed_stream(self._open_stream)) for _ in range(slots)]
        else:
            self._traffic = [asyncio.create_task(self._closed_loop(self._infer)) for _ in range(slots)]

    def open_loop(self, send_times: Iterator[float]) -> None:
        """Start the open-loop sends at ``send_times``: unary calls from a thread of their own on a sync
        channel (``_ThreadSender``), stream messages from a task of this event loop."""
        if self.cfg.rpc != "stream" and OPEN_SENDER != "aio":
            self._sender = _ThreadSender(self, send_times)
            return
        stream = self.cfg.rpc == "stream"
        self._sender = _StreamSender(self, self._open_stream) if stream else _UnarySender(self, self._infer)
        self._traffic = [asyncio.create_task(self._open_loop(self._sender, send_times))]

    # ----------------------------------------------------------------- control
    async def _sleep_until(self, t: float) -> None:
        assert self._stop_ev is not None
        delay = t - time.monotonic()
        if delay <= 0 or self._stop_ev.is_set():
            return
        try:
            await asyncio.wait_for(self._stop_ev.wait(), delay)
        except TimeoutError:
            pass

    async def _watch_stop(self) -> None:
        assert self._stop_ev is not None
        while not self._stop_ev.is_set():
            if self.control.stop_requested():
                self._stopping = True
                self._stop_ev.set()
                return
            await asyncio.sleep(STOP_POLL_S)

    async def _ticker(self, t_start: float) -> None:
        """Cut the warm-up, then each window at its edge, and report them."""
        cfg = self.cfg
        edge = t_start + cfg.plan.warmup_s
        cpu0, wall0 = time.process_time(), time.monotonic()
        await self._sleep_until(edge)
        if self._stopping:
            return
        warm = self._cut(edge)
        cpu1, wall1 = time.process_time(), time.monotonic()
        self.control.send(WarmupReport(ok=int(warm.lat_ms.size), errors=warm.errors, sent=warm.sent,
                                       late=warm.late, busy_pct=100.0 * (cpu1 - cpu0) / max(wall1 - wall0, 1e-9)))
        for k, length in enumerate(cfg.plan.lengths_s):
            end = edge + length
            await self._sleep_until(end)
            if self._stopping:
                return
            samples = self._cut(end)
            cpu2, wall2 = time.process_time(), time.monotonic()
            self.control.send(WindowReport(k=k, t0=edge, t1=end, samples=samples, cpu_s=cpu2 - cpu1,
                                           wall_s=wall2 - wall1, first_error=self.first_error))
            cpu1, wall1 = cpu2, wall2
            edge = end

    async def _check_ready(self, channel: grpc.aio.Channel) -> str | None:
        cfg = self.cfg
        try:
            await asyncio.wait_for(channel.channel_ready(), cfg.connect_timeout_s)
        except TimeoutError:
            return (f"cannot connect to the KServe v2 gRPC server at {cfg.url} within "
                    f"{cfg.connect_timeout_s:g} s; check that the server is running and listens on that "
                    "host:port")
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            if not (await stub.ServerReady(pb.ServerReadyRequest(), timeout=cfg.connect_timeout_s)).ready:
                return f"the server at {cfg.url} answered ServerReady=false; wait for it to finish loading"
            ready = await stub.ModelReady(pb.ModelReadyRequest(name=cfg.model_name),
                                          timeout=cfg.connect_timeout_s)
            if not ready.ready:
                return (f"model {cfg.model_name!r} is not ready on {cfg.url}; check the model name and the "
                        "server's log for load errors")
        except grpc.RpcError as exc:
            return (f"readiness check of {cfg.url} failed ({_describe(exc)}); check that it is a KServe v2 "
                    f"gRPC server serving model {cfg.model_name!r}")
        return None

    async def run(self) -> None:
        """Connect, report ready, wait for go, generate load until the last window or a stop request."""
        cfg = self.cfg
        self._stop_ev = asyncio.Event()
        async with grpc.aio.insecure_channel(cfg.url, options=CHANNEL_OPTIONS) as channel:
            if cfg.check_ready:
                problem = await self._check_ready(channel)
                if problem is not None:
                    self.control.send(WorkerError(problem))
                    return
            self._infer = channel.unary_unary(INFER_METHOD, request_serializer=None,
                                              response_deserializer=pb.ModelInferResponse.FromString)
            self._open_stream = channel.stream_stream(
                STREAM_METHOD, request_serializer=None, response_deserializer=pb.ModelStreamInferResponse.FromString)
            self.control.send(Ready())
            loop = asyncio.get_running_loop()
            t_start = await loop.run_in_executor(None, self.control.wait_go, 60.0)
            if t_start is None:
                return
            await self._sleep_until(t_start)
            watcher = asyncio.create_task(self._watch_stop())
            cfg.pattern.start(self, t_start, cfg.seed)
            try:
                await self._ticker(t_start)
            finally:
                self._stopping = True
                self._stop_ev.set()
                for task in [*self._traffic, watcher]:
                    task.cancel()
                if self._sender is not None:
                    await self._sender.close()
                await asyncio.gather(*self._traffic, watcher, return_exceptions=True)
        self.control.send(WorkerDone(self.first_error))


OPEN_SENDER = os.environ.get("FARM_LOADGEN_OPEN_SENDER", "thread")


class _ThreadSender:
    """Open-loop unary sends from a thread of their own: it sleeps to each scheduled time (``time.sleep``,
    clock_nanosleep: no event-loop turn, no epoll millisecond rounding between the schedule and the send)
    and starts the call on a sync channel (``future``); gRPC's own threads read the answers and record them
    through a done callback. Measured reason (``benchmarks/vs_perf_analyzer.py --loop open``): sends from
    the asyncio loop waited for the loop's turn behind answers being read, and left late."""

    def __init__(self, worker: LoadWorker, send_times: Iterator[float]) -> None:
        self.w = worker
        self.send_times = send_times
        self.reqs = worker.cfg.request_cycle()
        self.channel = grpc.insecure_channel(worker.cfg.url, options=CHANNEL_OPTIONS)
        self.infer = self.channel.unary_unary(INFER_METHOD, request_serializer=None,
                                              response_deserializer=pb.ModelInferResponse.FromString)
        self.inflight = 0
        self._count = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="farm-open-loop", daemon=True)
        self.thread.start()

    def outstanding(self) -> int:
        return self.inflight

    def _done(self, start: float, fut: Any) -> None:
        done = time.monotonic()
        with self._count:
            self.inflight -= 1
        w = self.w
        try:
            resp = fut.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as exc:
            if not w._stopping:
                w._record_err(done, _status_name(exc), _describe(exc))
            return
        w._record_ok(start, done, resp)

    def _run(self) -> None:
        w, cfg, now = self.w, self.w.cfg, time.monotonic
        for t in self.send_times:
            while not w._stopping and (delay := t - now()) > 0:
                time.sleep(min(delay, STOP_POLL_S))
            if w._stopping:
                return
            sent_at = now()
            with w._lock:
                w._sent += 1
                w._count_late(t, sent_at)
            if self.inflight >= cfg.max_outstanding:
                w._record_err(sent_at, BACKLOG_STATUS,
                              f"{BACKLOG_STATUS}: {cfg.max_outstanding} requests already in flight")
                continue
            with self._count:
                self.inflight += 1
            start = min(t, sent_at)
            self.infer.future(next(self.reqs)).add_done_callback(lambda f, s=start: self._done(s, f))

    async def close(self) -> None:
        await asyncio.to_thread(self.thread.join, 2.0)
        self.channel.close()


class _UnarySender:
    """Open-loop sends as ModelInfer calls, each its own task."""

    def __init__(self, worker: LoadWorker, infer: Any) -> None:
        self.w = worker
        self.infer = infer
        self.reqs = worker.cfg.request_cycle()
        self.inflight: set[asyncio.Task[None]] = set()

    def outstanding(self) -> int:
        return len(self.inflight)

    async def _one(self, scheduled: float, start: float) -> None:
        w = self.w
        w._count_late(scheduled, time.monotonic())  # the call starts now, a loop turn after the send
        try:
            resp = await self.infer(next(self.reqs))
        except grpc.RpcError as exc:
            if not w._stopping:
                w._record_err(time.monotonic(), _status_name(exc), _describe(exc))
            return
        w._record_ok(start, time.monotonic(), resp)

    async def send(self, scheduled: float, sent_at: float) -> None:
        task = asyncio.get_running_loop().create_task(self._one(scheduled, min(scheduled, sent_at)))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    async def close(self) -> None:
        tasks = list(self.inflight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _StreamSender:
    """Open-loop sends as messages of one ModelStreamInfer call; each request carries a fresh ``id`` and
    its answer is matched by it. A broken stream fails its outstanding requests and is replaced at the
    next send."""

    def __init__(self, worker: LoadWorker, open_stream: Any) -> None:
        self.w = worker
        self.open_stream = open_stream
        self.reqs = worker.cfg.request_cycle()
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.pending: dict[str, float] = {}  # request id -> start time, in send order
        self.next_id = 0

    def outstanding(self) -> int:
        return len(self.pending)

    def _fail_pending(self, name: str, text: str) -> None:
        if not self.w._stopping:
            done = time.monotonic()
            for _ in self.pending:
                self.w._record_err(done, name, text)
        self.pending.clear()

    async def _read(self, call: Any) -> None:
        w, pending = self.w, self.pending
        try:
            async for msg in call:
                done = time.monotonic()
                start = pending.pop(msg.infer_response.id, None)
                if start is None:
                    if not (msg.error_message and pending):
                        continue  # an answer to nothing we sent: ignore it
                    start = pending.pop(next(iter(pending)))  # an error without id: the oldest request
                w._record_msg(start, done, msg)
            self._fail_pending(STREAM_CLOSED_STATUS, STREAM_CLOSED_TEXT)
        except grpc.RpcError as exc:
            self._fail_pending(_status_name(exc), _describe(exc))
        if self.call is call:
            self.call = None

    async def send(self, scheduled: float, sent_at: float) -> None:
        start = min(scheduled, sent_at)
        if self.call is None:
            self.call = self.open_stream()
            self.reader = asyncio.create_task(self._read(self.call))
        rid = str(self.next_id)
        self.next_id += 1
        self.pending[rid] = start
        self.w._count_late(scheduled, time.monotonic())
        try:
            await self.call.write(with_id(next(self.reqs), rid))
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            if self.pending.pop(rid, None) is not None and not self.w._stopping:
                self.w._record_err(time.monotonic(), _status_name(exc), _describe(exc))

    async def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)


def run_worker(cfg: WorkerConfig, control: Control) -> None:
    """Run one worker to completion on a fresh event loop (the thread's or process's own)."""
    try:
        asyncio.run(LoadWorker(cfg, control).run())
    except Exception as exc:  # reported to the coordinator, which raises LoadGenError
        control.send(WorkerError(f"load worker failed: {type(exc).__name__}: {exc}"))

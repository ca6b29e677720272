"""Interleaved A/B measurement: two models measured alternately in short blocks on the same cores, so that what
the host does in between (another tenant, a frequency step, a noisy neighbour) hits both sides alike and cancels
in their ratio (randomized multiple interleaved trials: Abedi & Brecht, ICPE 2017; Kalibera & Jones, ISMM 2013).

Both models are loaded at once in this process, each an in-process engine session (``workers.engines``'s
backends, the edge benchmark's path: no transport), on the same core lease; the calling thread and every
engine thread stay on the lease's cores. Then, pair after pair, one block of each side (a few hundred ms;
which goes first drawn at random per pair), the load level of the cell (closed loop at a concurrency, or an open
loop at a rate) offered for the block's length. Each side is warmed before its first block and gets one untimed
call right before each of its blocks, so no block starts cold. Where both cannot be held at once
(``both_at_once`` False: the alternate-start mode), each block loads its side, warms it and closes it after.

An LLM engine's side (``workers.interleave_llm``) is its own server instead, launched by a runner on the same
lease, each call one streamed request: its blocks add TTFT p50 and output tokens/s.

Each block keeps its figures (:class:`Block`): requests, inferences/s, latency p50/p99 (open loop: from the
scheduled send), late sends, and the foreign load on the leased cores over the block (the host's "busy" note,
per block). The caller (``farm.verdict``) judges the pairs and decides when to stop: :func:`pairs` yields one
pair at a time.
"""
from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from farm.errors import ModelError
from schemas.engines import is_openai
from schemas.input_data import InputData
from schemas.load_levels import ClosedLoop, ConstantRate, PoissonRate
from workers.cores import pinned
from workers.engines.backends import make_backend
from workers.engines.base import Backend, IOSpec
from workers.engines.inputs import make_inputs
from workers.samplers.foreign import foreign_pct, measuring_cpu_s, read_cpu_ticks

#: a send starting later than this after its scheduled time is late (open loop), s
LATE_S = 0.001
#: the open loop's longest wait for the block's outstanding calls after its end, s
DRAIN_S = 5.0
SIDES = ("A", "B")


@dataclass(frozen=True)
class Cell:
    """The one configuration both sides are measured at: engine, device, batch size, intra-op threads (0: the
    lease's cores), load level, the inputs (name, dtype, per-sample shape; None: as the model declares them) and
    their data."""

    engine: str
    device: str
    batch_size: int
    threads: int
    level: ClosedLoop | ConstantRate | PoissonRate
    inputs: list[dict[str, Any]] | None = None
    data: InputData | None = None

    @property
    def llm(self) -> bool:
        """Whether the cell's engine is an LLM server's (its card's protocol: streamed OpenAI requests)."""
        return is_openai(self.engine)


@dataclass(frozen=True, slots=True)
class Reply:
    """What one streamed LLM call brought: its time to first token (s) and its output tokens."""

    ttft_s: float
    tokens: int


class SideLike(Protocol):
    """One side of the comparison: ``open`` loads (or starts) and warms it, ``call`` runs one call (an LLM side's
    answers its :class:`Reply`), ``close`` frees it; ``signature``: what it takes (equal for both sides)."""

    model: Path
    signature: list[tuple[str, str, tuple[int, ...]]]

    def open(self, warmup_s: float) -> None: ...

    def call(self) -> Reply | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Block:
    """One block's figures: its pair and side, its place in the pair (0 first), when it started (s since the
    first block) and how long it ran (s), the calls answered, inferences/s (calls x batch / s), latency p50 and
    p99 (ms; open loop: from the scheduled send), late sends (%, open loop), and the foreign load on the leased
    cores (%: busy time not this process's)."""

    pair: int
    side: str
    order: int
    start_s: float
    duration_s: float
    requests: int
    throughput_infer_per_s: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    late_pct: float | None
    foreign_cpu_pct: float | None
    ttft_p50_ms: float | None = None  # an LLM cell's: the streamed calls' time to first token, median
    output_tokens_per_s: float | None = None  # an LLM cell's: the tokens the block's calls generated / its length

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Side:
    """One model, loaded (``open``) on the calling thread's cores with its batch of inputs; ``call`` runs it."""

    def __init__(self, model: Path, cell: Cell) -> None:
        self.model = model
        self.cell = cell
        self.backend: Backend | None = None
        self.feed: dict[str, np.ndarray] = {}
        self.signature: list[tuple[str, str, tuple[int, ...]]] = []

    def open(self, warmup_s: float) -> None:
        """Load the model and warm it for ``warmup_s`` (at least one call)."""
        backend = make_backend(self.cell.engine)
        try:
            backend.load(self.model, self.cell.device, self.cell.threads or len(os.sched_getaffinity(0)))
            self.signature = input_signature(backend.inputs())
            self.feed = make_inputs(backend.inputs(), self.cell.inputs, self.cell.batch_size, data=self.cell.data)
        except BaseException:
            backend.close()
            raise
        self.backend = backend
        end = time.perf_counter() + warmup_s
        self.call()
        while time.perf_counter() < end:
            self.call()

    def call(self) -> Reply | None:
        assert self.backend is not None, "Side.open first"
        self.backend.infer(self.feed)
        return None

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None


def input_signature(specs: list[IOSpec]) -> list[tuple[str, str, tuple[int, ...]]]:
    """A model's inputs as (name, datatype, shape without the batch) in name order: two models can be compared
    on one cell only when theirs are equal."""
    return sorted((s.name, str(s.datatype), tuple(int(d) for d in (s.shape or ())[1:])) for s in specs)


def _shown(signature: list[tuple[str, str, tuple[int, ...]]]) -> str:
    """A signature as ``name:dtype:shape`` items."""
    return ", ".join(f"{n}:{d}:{'x'.join(map(str, shape)) or '-'}" for n, d, shape in signature)


#: one call's latency (s) and, for an LLM side, its reply
Call = tuple[float, Reply | None]


def _closed(side: SideLike, level: ClosedLoop, block_s: float, pool: ThreadPoolExecutor) -> list[Call]:
    """``level.concurrency`` loops calling ``side`` until ``block_s`` has passed; each call's latency (s) and reply."""
    end = time.perf_counter() + block_s

    def loop() -> list[Call]:
        lat: list[Call] = []
        while True:
            t = time.perf_counter()
            if t >= end:
                return lat
            reply = side.call()
            lat.append((time.perf_counter() - t, reply))

    if level.concurrency == 1:
        return loop()
    futures = [pool.submit(loop) for _ in range(level.concurrency)]
    return [x for f in futures for x in f.result()]


def send_times(level: ConstantRate | PoissonRate, block_s: float, rng: random.Random) -> list[float]:
    """The scheduled sends of an open-loop block, s from its start: evenly spaced or with exponential gaps."""
    times: list[float] = []
    t = 0.0 if level.type == "constant" else rng.expovariate(level.rate)
    while t < block_s:
        times.append(t)
        t += 1.0 / level.rate if level.type == "constant" else rng.expovariate(level.rate)
    return times


def _open(side: SideLike, level: ConstantRate | PoissonRate, block_s: float, pool: ThreadPoolExecutor,
          rng: random.Random) -> tuple[list[Call], int]:
    """Calls sent at ``level``'s schedule for ``block_s`` (each on a pool thread); their latencies from the
    scheduled send (s) with their replies, and how many sends left late."""
    lat: list[Call] = []
    lock = threading.Lock()
    late = 0

    def one(due: float) -> None:
        reply = side.call()
        done = time.perf_counter() - due
        with lock:
            lat.append((done, reply))

    start = time.perf_counter()
    futures = []
    for offset in send_times(level, block_s, rng):
        due = start + offset
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        elif -wait > LATE_S:
            late += 1
        futures.append(pool.submit(one, due))
    deadline = time.perf_counter() + DRAIN_S
    for f in futures:
        f.result(timeout=max(0.0, deadline - time.perf_counter()))
    return lat, late


class _CoreClock:
    """Busy time of the leased cores and this process's CPU time, read at a block's start and end."""

    def __init__(self, cores: list[int]) -> None:
        self.cores = cores
        self.hz = os.sysconf("SC_CLK_TCK")

    def read(self) -> tuple[tuple[int, int] | None, float]:
        return read_cpu_ticks(self.cores), measuring_cpu_s(children=False)

    def foreign(self, before: tuple[tuple[int, int] | None, float], after: tuple[tuple[int, int] | None, float]
                ) -> float | None:
        if before[0] is None or after[0] is None:
            return None
        busy = (after[0][0] - before[0][0]) / self.hz
        capacity = (after[0][1] - before[0][1]) / self.hz
        return foreign_pct(busy, after[1] - before[1], capacity)


def _figures(calls: list[Call], block_s: float, batch: int) -> dict[str, float | None]:
    """A block's figures from its calls over ``block_s`` (s): inferences/s, latency p50 and p99 (ms), and where the
    calls were streamed LLM ones, TTFT p50 (ms) and output tokens/s."""
    if not calls:
        return {"throughput_infer_per_s": 0.0, "latency_p50_ms": None, "latency_p99_ms": None}
    p50, p99 = np.percentile(np.asarray([c[0] for c in calls]) * 1e3, [50, 99])
    out: dict[str, float | None] = {"throughput_infer_per_s": len(calls) * batch / block_s,
                                    "latency_p50_ms": float(p50), "latency_p99_ms": float(p99)}
    replies = [r for _, r in calls if r is not None]
    if replies:
        out["ttft_p50_ms"] = float(np.median([r.ttft_s for r in replies])) * 1e3
        out["output_tokens_per_s"] = sum(r.tokens for r in replies) / block_s
    return out


@dataclass
class Interleaver:
    """The interleaved measurement of ``models`` (A, B) at ``cell`` on ``cores``: enter it to load (and warm)
    both, then iterate :meth:`pairs`. ``both_at_once`` False: the alternate-start mode (each block loads, warms
    and closes its side). ``seed`` fixes the order of each pair and the Poisson gaps. ``make_side``: side 0 (A) or 1
    (B) on the lease's cores (None: loaded in this process, :class:`Side`, the calling thread pinned to the
    cores; an LLM server's side pins its own server and leaves the client's threads where they are)."""

    models: tuple[Path, Path]
    cell: Cell
    cores: list[int]
    block_s: float = 0.3
    warmup_s: float = 0.5
    both_at_once: bool = True
    seed: int = 0
    make_side: Callable[[int, list[int]], SideLike] | None = None
    blocks: list[Block] = field(default_factory=list)
    _sides: tuple[SideLike, SideLike] | None = None
    _stack: ExitStack = field(default_factory=ExitStack)

    def __enter__(self) -> Interleaver:
        try:
            if self.make_side is None:
                self._stack.enter_context(pinned(self.cores))
            self._pool = self._stack.enter_context(ThreadPoolExecutor(max_workers=self._workers()))
            self._sides = (self._side(0), self._side(1))
            for side in self._sides:
                self._stack.callback(side.close)
                side.open(self.warmup_s)
                if not self.both_at_once:
                    side.close()
            a, b = self._sides
            if a.signature != b.signature:
                raise ModelError(f"{a.model.name} and {b.model.name} take different inputs ({_shown(a.signature)} "
                                 f"against {_shown(b.signature)}): an interleaved compare needs the same inputs")
        except BaseException:
            self._stack.close()
            raise
        self._rng = random.Random(self.seed)
        self._clock = _CoreClock(self.cores)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _side(self, index: int) -> SideLike:
        """Side ``index`` (0: A, 1: B) of ``models``."""
        return Side(self.models[index], self.cell) if self.make_side is None else self.make_side(index, self.cores)

    def _workers(self) -> int:
        """Pool threads: the closed loop's concurrency, or enough for an open loop's outstanding calls."""
        level = self.cell.level
        return level.concurrency if isinstance(level, ClosedLoop) else max(4, 2 * len(self.cores))

    def pairs(self) -> Iterator[tuple[Block, Block]]:
        """Pair after pair (endless: the caller stops), each an (A, B) block pair measured in random order."""
        pair = 0
        while True:
            order = [0, 1] if self._rng.random() < 0.5 else [1, 0]
            got: dict[int, Block] = {}
            for place, index in enumerate(order):
                got[index] = self._block(pair, index, place)
            self.blocks += [got[order[0]], got[order[1]]]
            yield got[0], got[1]
            pair += 1

    def _block(self, pair: int, index: int, place: int) -> Block:
        """One block of side ``index``, its figures recorded."""
        assert self._sides is not None
        side = self._sides[index]
        with self._held(side):
            side.call()  # one untimed call: the block never starts cold
            before = self._clock.read()
            t = time.perf_counter()
            calls, late = self._load(side)
            took = time.perf_counter() - t
            after = self._clock.read()
        is_open = not isinstance(self.cell.level, ClosedLoop)
        return Block(pair=pair, side=SIDES[index], order=place, start_s=t - self._t0, duration_s=took,
                     requests=len(calls), late_pct=(100.0 * late / max(1, len(calls))) if is_open else None,
                     foreign_cpu_pct=self._clock.foreign(before, after),
                     **_figures(calls, took, self.cell.batch_size))  # type: ignore[arg-type]

    @contextmanager
    def _held(self, side: SideLike) -> Iterator[None]:
        """``side`` loaded for a block: as it is (both held), or started and warmed now, closed after."""
        if self.both_at_once:
            yield
            return
        side.open(self.warmup_s)
        try:
            yield
        finally:
            side.close()

    def _load(self, side: SideLike) -> tuple[list[Call], int]:
        level = self.cell.level
        if isinstance(level, ClosedLoop):
            return _closed(side, level, self.block_s, self._pool), 0
        return _open(side, level, self.block_s, self._pool, self._rng)


def primary(cell: Cell) -> tuple[str, Callable[[Block], float | None]]:
    """The figure a verdict is taken on, and how to read it off a block: inferences/s in a closed loop, p50
    latency in an open loop (its throughput is the offered rate); an LLM cell's output tokens/s in a closed loop,
    TTFT p50 in an open one."""
    if cell.llm:
        if isinstance(cell.level, ClosedLoop):
            return "output_tokens_per_s", lambda b: b.output_tokens_per_s or None
        return "ttft_p50_ms", lambda b: b.ttft_p50_ms
    if isinstance(cell.level, ClosedLoop):
        return "throughput_infer_per_s", lambda b: b.throughput_infer_per_s or None
    return "latency_p50_ms", lambda b: b.latency_p50_ms

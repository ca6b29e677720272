"""Dynamic batching for farm's built-in server (Triton's ``dynamic_batching``, on the event loop).

Requests wait in one FIFO queue. A batch leaves when a model instance is free and either its rows reach
the preferred batch size (or the model's maximum batch), or its oldest request has waited
``max_queue_delay_us``; with a delay of 0 a free instance takes whatever is queued at once. Requests of
one batch are merged along axis 0 (only those with the same output names, input dtypes and per-sample
shapes), run as one inference, and the outputs are split back by rows. When a merged inference fails,
its requests run again one by one, so an error stays with the request that caused it.

``executed`` counts executions by batch size (rows), as Triton's ``batch_stats`` do.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from farm.errors import ServerError
from workers.engines.triton import DEFAULT_MAX_BATCH as MAX_BATCH  # rows of the largest merged batch

Outputs = dict[str, np.ndarray]
#: runs one (merged) inference: (feed, output names, submit time ns) -> (outputs, queue_ns, compute_ns)
RunFn = Callable[[dict[str, np.ndarray], list[str] | None, int], Awaitable[tuple[Outputs, int, int]]]


@dataclass
class _Entry:
    feed: dict[str, np.ndarray]
    out_names: list[str] | None
    rows: int
    key: tuple[Any, ...]
    fut: asyncio.Future[tuple[Outputs, int, int]]
    t_arrival: int = field(default_factory=time.perf_counter_ns)


def _key(feed: dict[str, np.ndarray], out_names: list[str] | None) -> tuple[Any, ...]:
    """What must match for two requests to be merged: outputs asked, input dtypes and per-sample shapes."""
    return (tuple(out_names) if out_names is not None else None,
            tuple((n, a.dtype.str, a.shape[1:]) for n, a in sorted(feed.items())))


class DynamicBatcher:
    """Merges requests arriving within ``max_queue_delay_us`` into batches of up to ``max_batch`` rows
    (sent at once when they reach ``preferred`` rows), over ``instances`` parallel model instances.

    A context manager: on exit, requests still waiting fail with a ServerError (the server is stopping)."""

    def __init__(self, run: RunFn, instances: int, max_batch: int, max_queue_delay_us: int,
                 preferred: int | None = None) -> None:
        if instances < 1 or max_batch < 1 or max_queue_delay_us < 0:
            raise ServerError(f"dynamic batching needs instances >= 1, max batch >= 1 and a delay >= 0 µs "
                              f"(got {instances}, {max_batch}, {max_queue_delay_us})")
        self._run = run
        self.instances = instances
        self.max_batch = max_batch
        self.target = min(preferred or max_batch, max_batch)
        self.delay_ns = max_queue_delay_us * 1000
        self.executed: Counter[int] = Counter()  # rows per execution -> executions
        self._pending: list[_Entry] = []
        self._busy = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # running batches (the loop keeps only weak references)

    def __enter__(self) -> DynamicBatcher:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        for e in pending:
            if not e.fut.done() and not e.fut.get_loop().is_closed():
                e.fut.set_exception(ServerError("the server stopped before this request ran"))

    @property
    def executions(self) -> int:
        """Inferences run (each merged batch counts once)."""
        return sum(self.executed.values())

    def report(self, stats: Any) -> None:
        """Fill a ``ModelStatistics`` message: executions, and per batch size (rows) how many ran."""
        stats.execution_count = self.executions
        for rows, n in sorted(self.executed.items()):
            stats.batch_stats.add(batch_size=rows).compute_infer.count = n

    async def infer(self, feed: dict[str, np.ndarray], out_names: list[str] | None,
                    t_submit: int) -> tuple[Outputs, int, int]:
        """Queue one request (``t_submit``: when it arrived, perf_counter ns; 0: now); returns its own
        (outputs, queue_ns, compute_ns) once its batch ran."""
        first = next(iter(feed.values()), None)
        rows = int(first.shape[0]) if first is not None and first.ndim > 0 else 0
        fut: asyncio.Future[tuple[Outputs, int, int]] = asyncio.get_running_loop().create_future()
        alone = rows < 1 or rows > self.max_batch  # cannot be merged: runs as it came
        key = ("alone", id(fut)) if alone else _key(feed, out_names)
        self._pending.append(_Entry(feed, out_names, rows, key, fut, t_submit or time.perf_counter_ns()))
        self._pump()
        return await fut

    def _take(self) -> tuple[int, bool]:
        """How many queued requests the next batch takes, and whether it is ready to go (full, or unable
        to grow)."""
        head = self._pending[0]
        n, rows = 1, head.rows
        for e in self._pending[1:]:
            if e.key != head.key or rows + e.rows > self.max_batch:
                return n, True
            n, rows = n + 1, rows + e.rows
        return n, rows >= self.target or head.key[0] == "alone"

    def _pump(self) -> None:
        """Send every batch that is ready while an instance is free; else wake up when the oldest request's
        delay is over."""
        while self._pending and self._busy < self.instances:
            n, ready = self._take()
            waited = time.perf_counter_ns() - self._pending[0].t_arrival
            if not ready and waited < self.delay_ns:
                if self._timer is None:
                    loop = asyncio.get_running_loop()
                    self._timer = loop.call_later((self.delay_ns - waited) / 1e9, self._wake)
                return
            batch, self._pending = self._pending[:n], self._pending[n:]
            self._busy += 1
            task = asyncio.ensure_future(self._execute(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _wake(self) -> None:
        self._timer = None
        self._pump()

    async def _execute(self, batch: list[_Entry]) -> None:
        """Run one batch and hand each request its share; on failure retry its requests one by one."""
        t_start = time.perf_counter_ns()
        try:
            feed = batch[0].feed if len(batch) == 1 else {
                name: np.concatenate([e.feed[name] for e in batch], axis=0) for name in batch[0].feed}
            outputs, queue_ns, compute_ns = await self._run(feed, batch[0].out_names, t_start)
            shares = _split(outputs, [e.rows for e in batch]) if len(batch) > 1 else [outputs]
        except Exception as exc:
            if len(batch) == 1:
                if not batch[0].fut.done():
                    batch[0].fut.set_exception(exc)
            else:  # find the culprit: each request alone, ahead of the queue
                self._pending[:0] = [_Entry(e.feed, e.out_names, e.rows, ("alone", id(e.fut)), e.fut, e.t_arrival)
                                     for e in batch]
            return
        finally:
            self._busy -= 1
            self._pump()
        self.executed[sum(e.rows for e in batch)] += 1
        for e, share in zip(batch, shares, strict=True):
            if not e.fut.done():
                e.fut.set_result((share, t_start - e.t_arrival + queue_ns, compute_ns))


@contextmanager
def batcher_for(cfg: Any, run: RunFn, batched: bool) -> Iterator[DynamicBatcher | None]:
    """The batcher a server config asks for (``cfg.max_queue_delay_us`` not None and a model with a
    dynamic batch dimension), or None."""
    if cfg.max_queue_delay_us is None or not batched:
        yield None
        return
    with DynamicBatcher(run, cfg.instances, MAX_BATCH, cfg.max_queue_delay_us, cfg.preferred_batch_size) as b:
        yield b


def _split(outputs: Outputs, rows: list[int]) -> list[Outputs]:
    """Split merged outputs back by request rows (every output must carry the batch on axis 0)."""
    total = sum(rows)
    bad = [n for n, a in outputs.items() if a.ndim == 0 or a.shape[0] != total]
    if bad:
        raise ServerError(f"output(s) {', '.join(bad)} have no batch dimension of {total} rows; "
                          "this model cannot be batched dynamically")
    cuts = np.cumsum(rows)[:-1]
    parts = {n: np.split(a, cuts, axis=0) for n, a in outputs.items()}
    return [{n: parts[n][i] for n in outputs} for i in range(len(rows))]

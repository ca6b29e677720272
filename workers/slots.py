"""Slots: a worker on a host with N GPUs runs N slots, each bound to one GPU and consuming its product's queue.

A ``Slot`` is one place a job runs: its index on the host, the GPU it owns (by UUID; ``None`` for the CPU
slot of a host without GPUs) and the queues it consumes. ``build_slots`` makes them from the detected
hardware (``farm worker --gpus 0,2`` picks GPUs by NVML index or UUID). The first slot also consumes the
host's ``farm.cpu`` and ``farm.edge`` queues, so CPU and edge jobs run one at a time as on a host without
GPUs, while every GPU serves its own product's queue.

Concurrency: each slot is its own worker process (``SlotSupervisor`` starts one ``farm worker --slot I``
child per slot). A process per slot, not a thread, because everything a worker does per job assumes it
owns its process: the job watch interrupts a job by signalling the main thread (``workers.cancel``), the
Celery solo pool runs one job in the main thread with prefetch 1, and SIGTERM hands the job in hand back.
Each child registers its own worker row (``<worker id>-s<index>``) and heartbeats it, so the scheduler
requeues the jobs of one dead slot without touching the others, and ``farm workers`` shows one line per
slot with what it is doing. A child gets ``CUDA_VISIBLE_DEVICES=<its GPU's UUID>`` and a runner that knows
only its GPU (server processes: ``CUDA_VISIBLE_DEVICES``; containers: a device request for that UUID);
NVML samples that UUID only.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from farm.errors import ConfigError
from schemas import GpuInfo, WorkerHardware
from schemas.hardware import SlotJson
from schemas.queues import gpu_queue
from workers import signal_stack

log = logging.getLogger("farm.worker")


@dataclass(frozen=True)
class Slot:
    """One job at a time on one GPU (``gpu``; None: a CPU slot), consuming ``queues`` (in priority order)."""

    index: int
    queues: tuple[str, ...]
    gpu: GpuInfo | None = None

    @property
    def gpu_uuid(self) -> str | None:
        return self.gpu.uuid if self.gpu is not None else None

    @property
    def gpu_index(self) -> int | None:
        """The GPU's NVML index on this host."""
        return self.gpu.index if self.gpu is not None else None

    @property
    def product(self) -> str:
        """The GPU product's slug (``cpu`` for a CPU slot)."""
        return self.gpu.slug if self.gpu is not None else "cpu"

    @property
    def gpus(self) -> list[GpuInfo]:
        """The GPUs this slot may use: its own, or none."""
        return [self.gpu] if self.gpu is not None else []

    def describe(self) -> SlotJson:
        """The slot as stored in its worker row's hardware JSON (``slot``)."""
        return SlotJson(index=self.index, gpu_uuid=self.gpu_uuid, gpu_index=self.gpu_index,
                        gpu_name=self.gpu.name if self.gpu is not None else None, product=self.product,
                        queues=list(self.queues))

    def hardware(self, host: WorkerHardware) -> WorkerHardware:
        """``host``'s hardware as this slot registers it: its GPU only and its queues."""
        return host.model_copy(update={"gpus": self.gpus, "queues": list(self.queues)})

    def env(self) -> dict[str, str]:
        """Environment for this slot's process: the GPU it may see (CUDA, by UUID)."""
        return {"CUDA_VISIBLE_DEVICES": self.gpu_uuid} if self.gpu_uuid is not None else {}


def select_gpus(gpus: Sequence[GpuInfo], wanted: str | None) -> list[GpuInfo]:
    """The GPUs named by ``wanted`` (comma-separated NVML indices or UUIDs; None: all), in the order given.

    ConfigError naming the host's GPUs when one is unknown or named twice."""
    if wanted is None:
        return list(gpus)
    chosen: list[GpuInfo] = []
    for name in (w.strip() for w in wanted.split(",")):
        if not name:
            continue
        gpu = next((g for g in gpus if str(g.index) == name or g.uuid == name), None)
        if gpu is None:
            have = ", ".join(f"{g.index} ({g.name})" for g in gpus) or "none (NVML found no GPU)"
            raise ConfigError(f"this host has no GPU {name!r}; its GPUs (NVML index): {have}")
        if gpu in chosen:
            raise ConfigError(f"GPU {name!r} is named twice in --gpus; name each GPU once")
        chosen.append(gpu)
    if not chosen:
        raise ConfigError("--gpus names no GPU; give NVML indices such as 0,2 (see nvidia-smi -L)")
    return chosen


def build_slots(hardware: WorkerHardware, gpus: str | None = None) -> list[Slot]:
    """The slots of a worker with ``hardware`` (its ``queues`` already filtered by ``-Q``): one per GPU
    selected by ``gpus`` whose product queue is served, the first one also taking the CPU and edge queues;
    one CPU slot with every queue when there is no such GPU."""
    chosen = select_gpus(hardware.gpus, gpus)
    served = [g for g in chosen if gpu_queue(g.slug) in hardware.queues]
    if not served:
        return [Slot(index=0, queues=tuple(hardware.queues))]
    product_queues = {gpu_queue(g.slug) for g in hardware.gpus}
    host_queues = tuple(q for q in hardware.queues if q not in product_queues)
    return [Slot(index=i, gpu=g, queues=(gpu_queue(g.slug), *(host_queues if i == 0 else ())))
            for i, g in enumerate(served)]


def slot_worker_id(worker_id: str, slot: Slot) -> str:
    """The worker id of ``slot``'s process: ``<worker id>-s<index>``."""
    return f"{worker_id}-s{slot.index}"


def _term_with_parent() -> None:
    """In a slot child before exec: SIGTERM it when its supervisor dies (Linux; elsewhere a no-op), so it
    hands its job back instead of running on unsupervised."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class SlotSupervisor:
    """Runs one ``farm worker`` child process per slot and waits for them all.

    ``argv(slot)`` is a child's command line. SIGTERM and SIGINT are passed on to every child once (the
    children run in their own sessions, so a terminal's Ctrl-C reaches them only through here). When a
    child exits while the others serve (not in burst mode), the others are stopped too: one exit code for
    whoever restarts the worker: that child's. Otherwise returns the highest exit code of the children
    (128 + N: killed by signal N).
    """

    slots: list[Slot]
    argv: Callable[[Slot], list[str]]
    burst: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stopping: bool = False

    def _forward(self, signum: int, frame: FrameType | None = None) -> None:
        self.stop(signal.SIGTERM)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask every child still running to stop (warm shutdown: each hands its job back)."""
        if self.stopping:
            return
        self.stopping = True
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)

    def run(self) -> int:
        previous = {s: signal_stack.install(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for slot in self.slots:
                self.procs.append(subprocess.Popen(self.argv(slot), env={**os.environ, **slot.env()},
                                                   start_new_session=True, preexec_fn=_term_with_parent))
            return self._wait()
        finally:
            self.stop(signal.SIGTERM)
            for p in self.procs:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
            for s, handler in previous.items():
                signal_stack.restore(s, handler)

    def _wait(self) -> int:
        codes: dict[int, int] = {}
        first: int | None = None  # the code of the child whose exit stopped the others
        while len(codes) < len(self.procs):
            for i, p in enumerate(self.procs):
                if i in codes:
                    continue
                try:
                    rc = p.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    continue
                codes[i] = rc if rc >= 0 else 128 - rc  # killed by a signal: 128 + its number, as a shell says
                if not self.burst and not self.stopping:
                    log.error("slot %d's worker exited with code %d; stopping the other slots", i, codes[i])
                    first = codes[i]
                    self.stop()
        return first if first is not None else max(codes.values(), default=0)


def self_argv(args: Sequence[str]) -> list[str]:
    """``farm worker ARGS`` as a command line for a child of this Python."""
    return [sys.executable, "-m", "farm", "worker", *args]

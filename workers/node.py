"""A worker node: registers its hardware, heartbeats, and consumes only the queues it can serve.

A node runs one slot (``workers.slots``): on a GPU host each GPU's slot is its own node process, bound to
that GPU. ``WorkerNode`` is a context manager (registration + heartbeat thread). ``serve_forever`` runs a real
Celery worker (late ack, prefetch 1); ``drain`` is the burst mode: it takes messages from the broker
until the queues are empty, runs them, acks them, and returns (used by tests and one-shot hosts).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, update

from farm.broker import Broker
from farm.db.models import Worker, live_worker, utcnow
from farm.db.session import session_scope
from farm.secrets import credentials
from farm.settings import get_settings
from farm.telemetry import WorkerMetrics
from schemas import GpuInfo, WorkerHardware, WorkerStatus
from schemas.hardware import HardwareJson
from workers import signal_stack
from workers.cancel import SHUTDOWN, JobWatch
from workers.execute import replay_spool, run_job
from workers.hardware import gpu_uuids_for
from workers.ledger import job_status
from workers.runners.base import Runner
from workers.slots import Slot
from workers.spool import Spool

log = logging.getLogger("farm.worker")


def new_worker_id() -> str:
    """``<hostname>-<pid>-<random>``: unique per worker process."""
    return f"{socket.gethostname()[:80]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerNode:
    """One worker process: its id, hardware, runner and the heartbeat that says it is alive. ``slot``: the
    slot it runs (its GPU and queues; None: one slot with all of ``hardware``, as embedded mode runs);
    ``slot_count``: how many slots this worker runs on the host (its jobs divide the host's cores by it)."""

    runner: Runner
    hardware: WorkerHardware
    slot: Slot | None = None
    slot_count: int = 1
    worker_id: str = field(default_factory=new_worker_id)
    heartbeat_s: float = field(default_factory=lambda: get_settings().heartbeat_s)

    def __post_init__(self) -> None:
        settings = get_settings()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current_job: str | None = None
        self.watch = JobWatch(job_status, poll_s=settings.cancel_poll_s)
        self.spool = Spool(settings.spool_dir)
        self.stopping = False
        self.metrics = WorkerMetrics(self.worker_id, self.slot.index if self.slot is not None else 0,
                                     self.runner.name)

    @property
    def queues(self) -> list[str]:
        return list(self.slot.queues) if self.slot is not None else list(self.hardware.queues)

    @property
    def gpus(self) -> list[GpuInfo]:
        """The GPUs this node's jobs may use: its slot's one GPU, else the host's."""
        return self.slot.gpus if self.slot is not None else list(self.hardware.gpus)

    def gpu_uuids_for(self, device: str) -> list[str]:
        """The UUID of the GPU that serves a job on ``device`` (this node's, by product; empty for cpu)."""
        return gpu_uuids_for(self.gpus, device)

    def registered_hardware(self) -> HardwareJson:
        """The hardware JSON of this node's worker row: its slot's GPU and queues, the slot itself, and the names
        (never the values) of the endpoint credentials its operator set up (``farm submit`` checks a request's)."""
        hw = self.hardware if self.slot is None else self.slot.hardware(self.hardware)
        out = HardwareJson(hostname=hw.hostname, cpu=hw.cpu.model_dump(mode="json"),
                           gpus=[g.model_dump(mode="json") for g in hw.gpus], docker=hw.docker, queues=list(hw.queues))
        if self.slot is not None:
            out["slot"] = self.slot.describe()
        out["credentials"] = sorted(credentials())
        return out

    def register(self) -> None:
        """Insert or refresh this worker's row: hardware JSON, queues, runner, status online."""
        with session_scope() as s:
            row = s.get(Worker, self.worker_id)
            values: dict[str, Any] = dict(hostname=self.hardware.hostname,
                                          hardware=self.registered_hardware(), queues=self.queues,
                                          runner=self.runner.name, status=WorkerStatus.online, last_heartbeat=utcnow())
            if row is None:
                s.add(Worker(id=self.worker_id, started_at=utcnow(), **values))
            else:
                for k, v in values.items():
                    setattr(row, k, v)

    def beat(self) -> None:
        """One heartbeat: last_heartbeat = now, and the job in hand."""
        with session_scope() as s:
            s.execute(update(Worker).where(Worker.id == self.worker_id)
                      .values(last_heartbeat=utcnow(), status=WorkerStatus.online, current_job_id=self.current_job))

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
            except Exception as exc:  # the database may blink; the next beat tries again
                self.metrics.beat(ok=False)
                log.warning("heartbeat failed: %s", " ".join(str(exc).split())[:200])
                continue
            self.metrics.beat(ok=True)
            self.flush_spool()

    def flush_spool(self) -> int:
        """Write results spooled during a database outage (called after each successful heartbeat)."""
        try:
            return replay_spool(self.spool) if self.spool.pending() else 0
        except Exception as exc:
            log.warning("replaying spooled results failed: %s", exc)
            return 0

    def shutdown(self, signum: int | None = None) -> None:
        """Stop taking jobs and hand the job in hand back to its queue (SIGTERM)."""
        self.stopping = True
        self.watch.interrupt(SHUTDOWN)

    def dead_neighbours(self) -> list[str]:
        """Ids of workers on this host that are not alive: offline, lost, or silent past the dead-after time."""
        with session_scope() as s:
            rows = s.execute(select(Worker.id).where(
                Worker.hostname == self.hardware.hostname, Worker.id != self.worker_id, ~live_worker())).scalars().all()
        return list(rows)

    def __enter__(self) -> WorkerNode:
        self.register()
        try:
            removed = self.runner.cleanup_dead(self.dead_neighbours())
            if removed:
                log.info("removed %d container(s) left by dead workers on this host", len(removed))
        except Exception as exc:  # cleanup is best effort; it never keeps a worker from starting
            log.warning("could not clean up after dead workers: %s", exc)
        self.flush_spool()
        self.watch.__enter__()
        self._thread = threading.Thread(target=self._beat_loop, name="farm-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self.watch.__exit__(None, None, None)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush_spool()
        try:
            with session_scope() as s:
                s.execute(update(Worker).where(Worker.id == self.worker_id)
                          .values(status=WorkerStatus.offline, current_job_id=None, last_heartbeat=utcnow()))
        except Exception as exc:
            log.warning("could not mark worker offline: %s", exc)
        self.runner.close()

    def run(self, job_id: str) -> str:
        """Run one delivered job (claiming it first)."""
        self.current_job = job_id
        self.metrics.busy.set(1)
        started = time.monotonic()
        try:
            return run_job(job_id, self.worker_id, self.runner, self.gpu_uuids_for, watch=self.watch,
                           spool=self.spool, slot=self.slot.index if self.slot is not None else 0,
                           slots=self.slot_count)
        finally:
            self.current_job = None
            self.metrics.busy.set(0)
            self.metrics.job_done(job_id, time.monotonic() - started)

    def drain(self, max_jobs: int | None = None) -> int:
        """Burst mode: consume this node's queues until empty; returns the number of messages handled."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal_stack.install(signal.SIGTERM, lambda signum, frame: self.shutdown(signum))
        try:
            return Broker().drain(self.queues, self.run, max_jobs, stopping=lambda: self.stopping)
        finally:
            if previous is not None:
                signal_stack.restore(signal.SIGTERM, previous)

    def serve_forever(self, loglevel: str = "INFO") -> None:
        """Run a Celery worker on this node's queues until stopped (SIGTERM: warm shutdown)."""
        Broker().serve(self.run, self.queues, hostname=f"{self.worker_id}@{self.hardware.hostname[:60]}",
                       loglevel=loglevel, on_shutdown=self.shutdown)

"""Prometheus metrics of workers and the scheduler (``prometheus_client``), served by ``MetricsServer``.

Every process has a registry of its own: ``WorkerMetrics`` (jobs it handled by queue and final status, their
durations, its heartbeats, the stolen CPU share of its measurements) and ``SchedulerMetrics`` (the ledger at
scrape time: jobs by state and queue, the oldest queued job per queue, workers by status and their heartbeat
age; plus its own passes and what they changed). Both carry ``HostCollector``: the host's stolen CPU time
from ``/proc/stat`` (``rate(farm_host_cpu_steal_seconds_total) / rate(farm_host_cpu_seconds_total)``).
``FARM_METRICS_PORT`` turns the endpoint on (``farm worker`` slot I listens on port + I; 0: any free port,
printed at start).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from farm.db.models import Job, Result, Worker, utcnow
from farm.db.session import session_scope
from farm.errors import ConfigError
from farm.steal import read_steal
from schemas.job import JobStatus
from schemas.worker import WorkerStatus

log = logging.getLogger("farm.metrics")

#: job duration histogram buckets, s: no-op jobs (under a second) up to the 2 h visibility timeout
JOB_DURATION_BUCKETS_S = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
#: stolen CPU share of one measurement, %
STEAL_BUCKETS_PCT = (0.5, 1, 2, 5, 10, 20, 50, 100)


class HostCollector(Collector):
    """The host's CPU time and stolen CPU time since boot, s (read at scrape time; absent without steal)."""

    def collect(self) -> Iterator[Metric]:
        ticks = read_steal()
        if ticks is None:
            return
        hz = os.sysconf("SC_CLK_TCK")
        steal = CounterMetricFamily("farm_host_cpu_steal_seconds", "CPU time the hypervisor took from this "
                                    "host's vCPUs since boot, s (all CPUs)")
        steal.add_metric([], ticks[0] / hz)
        total = CounterMetricFamily("farm_host_cpu_seconds", "CPU time of this host since boot, s (all CPUs)")
        total.add_metric([], ticks[1] / hz)
        yield steal
        yield total


class WorkerMetrics:
    """One worker process's series (a ``WorkerNode`` owns one and updates it)."""

    def __init__(self, worker_id: str, slot: int = 0, runner: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Info("farm_worker", "This worker process", registry=r).info(
            {"worker_id": worker_id, "slot": str(slot), "runner": runner})
        self.jobs = Counter("farm_worker_jobs", "Jobs this worker handled, by queue and the status they ended in",
                            ["queue", "status"], registry=r)
        self.duration = Histogram("farm_job_duration_seconds", "Time from delivery to the job's end on this "
                                  "worker (claim, model fetch, serving, measurement, result write), s",
                                  ["queue", "status"], buckets=JOB_DURATION_BUCKETS_S, registry=r)
        self.steal = Histogram("farm_job_cpu_steal_percent", "Share of the host's CPU time stolen by the "
                               "hypervisor while a job measured, %", ["queue"], buckets=STEAL_BUCKETS_PCT,
                               registry=r)
        self.busy = Gauge("farm_worker_busy", "1 while this worker has a job in hand", registry=r)
        self.heartbeats = Counter("farm_worker_heartbeats", "Heartbeats written to the database", registry=r)
        self.heartbeat_failures = Counter("farm_worker_heartbeat_failures", "Heartbeats that failed (database "
                                          "unreachable)", registry=r)
        self.last_heartbeat = Gauge("farm_worker_last_heartbeat_timestamp_seconds", "Unix time of the last "
                                    "heartbeat written, s", registry=r)
        r.register(HostCollector())

    def beat(self, ok: bool) -> None:
        """Count one heartbeat (``ok``: written) and remember when it was written."""
        if ok:
            self.heartbeats.inc()
            self.last_heartbeat.set_to_current_time()
        else:
            self.heartbeat_failures.inc()

    def job_done(self, job_id: str, seconds: float) -> None:
        """Record a handled job: its queue, status and stolen share are read back from the ledger."""
        try:
            with session_scope() as s:
                row = s.execute(select(Job.queue, Job.status, Result.__table__.c.cpu_steal_pct)
                                .outerjoin(Result, Result.job_id == Job.id).where(Job.id == job_id)).first()
        except Exception as exc:  # the database may blink: the job counts under an unknown status
            log.warning("metrics: could not read job %s back (%s)", job_id, type(exc).__name__)
            row = None
        queue, status, steal = (row[0], str(row[1]), row[2]) if row is not None else ("unknown", "unknown", None)
        self.jobs.labels(queue, status).inc()
        self.duration.labels(queue, status).observe(seconds)
        if steal is not None:
            self.steal.labels(queue).observe(steal)


class LedgerCollector(Collector):
    """The ledger at scrape time: jobs by state and queue, oldest queued job, workers and heartbeat ages."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("farm_ledger_up", "1 when the database answered this scrape")
        try:
            families = self._read()
        except Exception as exc:  # a scrape during a database outage says so instead of failing
            log.warning("metrics: ledger unreadable (%s)", " ".join(str(exc).split())[:200])
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    @staticmethod
    def _read() -> list[Metric]:
        jobs = GaugeMetricFamily("farm_jobs", "Jobs in the ledger by queue and state", labels=["queue", "status"])
        oldest = GaugeMetricFamily("farm_queue_oldest_job_age_seconds", "Age of the oldest queued job per queue, s",
                                   labels=["queue"])
        workers = GaugeMetricFamily("farm_workers", "Registered workers by status", labels=["status"])
        age = GaugeMetricFamily("farm_worker_heartbeat_age_seconds", "Seconds since each online worker's last "
                                "heartbeat", labels=["worker", "host"])
        now = utcnow()
        with session_scope() as s:
            for queue, status, n in s.execute(select(Job.queue, Job.status, func.count())
                                              .group_by(Job.queue, Job.status)):
                jobs.add_metric([queue, str(status)], n)
            for queue, first in s.execute(select(Job.queue, func.min(Job.created_at))
                                          .where(Job.status == JobStatus.queued).group_by(Job.queue)):
                oldest.add_metric([queue], _age_s(now, first))
            for status, n in s.execute(select(Worker.status, func.count()).group_by(Worker.status)):
                workers.add_metric([status], n)
            for wid, host, beat in s.execute(select(Worker.id, Worker.hostname, Worker.last_heartbeat)
                                             .where(Worker.status == WorkerStatus.online)):
                age.add_metric([wid, host], _age_s(now, beat))
        return [jobs, oldest, workers, age]


def _age_s(now: datetime, then: datetime) -> float:
    """Seconds from ``then`` to ``now`` (a naive ``then``, as an aggregate may come back, is UTC), at least 0."""
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return max(0.0, (now - then).total_seconds())


class SchedulerMetrics:
    """The scheduler's series: the ledger (read at scrape time), the host, and its own passes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.passes = Counter("farm_scheduler_passes", "Reconciliation passes by outcome", ["outcome"], registry=r)
        self.changes = Counter("farm_scheduler_changes", "What reconciliation changed: lost_workers, requeued, "
                               "failed, timed_out, resent", ["kind"], registry=r)
        self.pass_seconds = Histogram("farm_scheduler_pass_seconds", "Duration of one reconciliation pass, s",
                                      registry=r)
        r.register(LedgerCollector())
        r.register(HostCollector())

    def observe(self, report: Any, seconds: float) -> None:
        """Record one pass (``report``: a ``ReconcileReport``, None when the pass failed)."""
        self.pass_seconds.observe(seconds)
        self.passes.labels("failed" if report is None else "ok").inc()
        if report is not None:
            for kind in ("lost_workers", "requeued", "failed", "timed_out", "resent"):
                self.changes.labels(kind).inc(len(getattr(report, kind)))


class MetricsServer(AbstractContextManager["MetricsServer"]):
    """prometheus_client's HTTP endpoint for ``registry`` on ``addr:port`` (0: a free port; ``port`` is the
    bound one once entered), stopped and its thread joined on exit."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> None:
        self.registry = registry
        self.port = port
        self.addr = addr
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The endpoint on the address really bound once entered (``0.0.0.0``: every interface), else asked."""
        host = str(self._server.server_address[0]) if self._server is not None else self.addr
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def __enter__(self) -> MetricsServer:
        try:
            self._server, self._thread = start_http_server(self.port, self.addr, self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {self.addr}:{self.port} ({exc.strerror}); set "
                              "FARM_METRICS_PORT to a free port (0: any)") from None
        self.port = int(self._server.server_port)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def slot_port(port: int | None, slot: int) -> int | None:
    """The metrics port of a worker's slot ``slot``: ``port`` + slot (0 stays 0: any free port; None: off)."""
    return port + slot if port else port


@contextmanager
def serve_metrics(registry: CollectorRegistry, port: int | None, addr: str, who: str) -> Iterator[MetricsServer | None]:
    """A running ``MetricsServer`` for ``who`` (its URL printed on stderr), or None when ``port`` is None."""
    if port is None:
        yield None
        return
    with MetricsServer(registry, port, addr) as server:
        print(f"{who}: metrics on {server.url}", file=sys.stderr, flush=True)
        yield server

"""``farm scheduler``: a loop process that reconciles the ledger every ``reconcile_interval_s``.

Run one (or more: every change is a guarded UPDATE, so two schedulers do not double-requeue a job).
It survives database and broker outages: a failed pass is logged and retried next interval. After the
database comes back it waits ``worker_dead_after_s`` before declaring any worker dead, because workers
could not heartbeat during the outage either.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from farm.settings import get_settings
from farm.telemetry import SchedulerMetrics
from scheduler.fairshare import release
from scheduler.reconcile import ReconcileReport, reconcile

log = logging.getLogger("farm.scheduler")


@dataclass
class SchedulerService:
    """The reconciliation loop. ``stop`` (an Event) ends it between passes."""

    interval_s: float = field(default_factory=lambda: get_settings().reconcile_interval_s)
    #: how often held jobs of API requests are released (fair share), s
    release_s: float = field(default_factory=lambda: get_settings().release_interval_s)
    stop: threading.Event = field(default_factory=threading.Event)
    passes: int = 0
    failures: int = 0
    #: monotonic time from which worker heartbeats are trusted again (after a database outage)
    trust_beats_from: float = field(default_factory=time.monotonic)
    #: its Prometheus series (served by `farm scheduler` when FARM_METRICS_PORT is set)
    metrics: SchedulerMetrics = field(default_factory=SchedulerMetrics)

    def run_once(self) -> ReconcileReport | None:
        """One pass; None when the database or broker was unreachable (logged)."""
        settings = get_settings()
        # heartbeats are missing for an outage: judge workers only once they could beat again
        started = time.monotonic()
        judge = started >= self.trust_beats_from
        try:
            report = reconcile(settings, judge_workers=judge)
        except Exception as exc:
            self.failures += 1
            self.metrics.observe(None, time.monotonic() - started)
            self.trust_beats_from = time.monotonic() + settings.worker_dead_after_s
            log.warning("reconciliation failed (%s: %s); retrying in %.1f s", type(exc).__name__,
                        " ".join(str(exc).split())[:200], self.interval_s)
            return None
        self.passes += 1
        self.metrics.observe(report, time.monotonic() - started)
        if report.changed:
            log.info("reconciled: %s", report.summary())
        return report

    def release_once(self) -> list[tuple[str, str]]:
        """One fair-share release pass (``scheduler.fairshare.release``); [] when it failed (logged)."""
        try:
            return release()
        except Exception as exc:  # the database or broker is down: the next pass tries again
            log.warning("releasing held jobs failed (%s: %s)", type(exc).__name__, " ".join(str(exc).split())[:200])
            return []

    def run_forever(self) -> None:
        """Reconcile every ``interval_s`` and release held jobs every ``release_s``, until ``stop`` is set."""
        log.info("farm scheduler: reconciling every %.1f s, releasing held jobs every %.1f s", self.interval_s,
                 self.release_s)
        next_pass = 0.0
        while not self.stop.is_set():
            if time.monotonic() >= next_pass:
                self.run_once()
                next_pass = time.monotonic() + self.interval_s
            self.release_once()
            self.stop.wait(min(self.release_s, max(0.0, next_pass - time.monotonic())))

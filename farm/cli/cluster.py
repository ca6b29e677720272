"""Cluster commands: ``farm scheduler`` (the reconciliation service) and ``farm cancel``."""
from __future__ import annotations

import json
import signal
import time

import typer

from farm.cli import remote
from farm.cli.followups import next_hint
from farm.cli.prepare import prepare_db
from farm.cli.request_options import ID_ARGS, ID_HELP, request_ids
from farm.cli.views import console, err_console
from farm.errors import ConfigError
from farm.logs import setup_logging
from farm.settings import get_settings, mask_url
from scheduler.reconcile import cancel_request, still_running
from workers import signal_stack


def scheduler(
    once: bool = typer.Option(False, "--once", help="One reconciliation pass, then exit."),
    interval: float | None = typer.Option(None, "--interval", help="Seconds between passes "
                                             "(default FARM_RECONCILE_INTERVAL_S)."),
    loglevel: str = typer.Option("INFO", "--loglevel", envvar="FARM_LOGLEVEL"),
) -> None:
    """Run the scheduler service: requeue jobs of dead workers (up to FARM_MAX_ATTEMPTS), fail jobs past
    their time limit, and re-send queued jobs missing from the broker."""
    from farm.telemetry import serve_metrics  # noqa: PLC0415 - prometheus_client: +0.035 s on every CLI start, measured
    from scheduler.service import SchedulerService  # noqa: PLC0415 - as above (it imports farm.telemetry)

    settings = get_settings()
    if settings.embedded:
        raise ConfigError("farm scheduler needs a broker: set FARM_BROKER_URL (e.g. redis://127.0.0.1:6379/0)")
    if interval is not None and interval <= 0:
        raise ConfigError(f"--interval must be positive, got {interval:g}")
    setup_logging(loglevel, settings.log_format)
    prepare_db()
    service = SchedulerService(interval_s=interval or settings.reconcile_interval_s)
    err_console.print(f"scheduler: database {mask_url(settings.db_url)}; broker {mask_url(settings.broker_url)}; "
                      f"every {service.interval_s:g} s; dead after {settings.worker_dead_after_s:g} s; "
                      f"max attempts {settings.max_attempts}; re-send after {settings.requeue_after_s:g} s")
    if once:
        report = service.run_once()
        if report is None:
            raise ConfigError("the reconciliation pass failed (see the log); is the database up?")
        print(json.dumps({"lost_workers": report.lost_workers, "requeued": report.requeued,
                          "failed": report.failed, "timed_out": report.timed_out, "resent": report.resent}))
        return
    signal_stack.install(signal.SIGTERM, lambda *_: service.stop.set())
    with serve_metrics(service.metrics.registry, settings.metrics_port, settings.metrics_addr, "scheduler"):
        try:
            service.run_forever()
        except KeyboardInterrupt:
            pass
    err_console.print(f"scheduler: stopped after {service.passes} pass(es)")


def cancel(
    request_id: str = typer.Argument(..., callback=request_ids, help=ID_HELP),
    wait: float = typer.Option(30.0, "--wait", help="Seconds to wait for running jobs' servers to stop "
                               "(0: do not wait)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Cancel a request: queued jobs never run; running jobs are stopped (server/container ended)."""
    if get_settings().remote:
        remote.cancel(request_id, as_json)
        return
    prepare_db()
    out = cancel_request(request_id)
    remaining = list(out.pop("running_ids"))
    deadline = time.monotonic() + max(0.0, wait)
    while remaining and time.monotonic() < deadline:
        time.sleep(0.5)
        remaining = still_running(remaining)
    out["still_stopping"] = len(remaining)
    if as_json:
        print(json.dumps(out))
        return
    console.print(f"request {out['request_id']}: {out['queued_cancelled']} queued job(s) cancelled, "
                  f"{out['running_cancelled']} running job(s) stopped"
                  + (f" ({len(remaining)} still stopping: their workers stop them within seconds)"
                     if remaining else ""))
    next_hint(f"farm status {out['request_id'][:8]}", f"farm resume {out['request_id'][:8]} to run what is left")


def register(app: typer.Typer) -> None:
    """Attach the cluster commands to the CLI."""
    app.command()(scheduler)
    app.command(context_settings=ID_ARGS)(cancel)  # -1, -2: request ids

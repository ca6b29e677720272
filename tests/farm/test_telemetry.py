"""Prometheus endpoints of a real worker and a real scheduler, Celery task events, JSON logs."""
from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from farm.logs import JsonFormatter
from farm.telemetry import MetricsServer
from tests.helpers import farm_env, start_worker, wait_done


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at ``url``: (name, sorted labels) -> value."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def metrics_url(log: Path, proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """The endpoint a process printed at start (``...: metrics on http://...``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"metrics on (http://\S+)", log.read_text() if log.exists() else "")
        if found:
            return found.group(1)
        assert proc.poll() is None, log.read_text()[-2000:]
        time.sleep(0.2)
    raise AssertionError(f"no metrics URL printed: {log.read_text()[-2000:]}")


def test_metrics_server_serves_its_registry_on_a_free_port_and_stops() -> None:
    registry = CollectorRegistry()
    Counter("farm_test_things", "things", registry=registry).inc(3)
    with MetricsServer(registry, 0, "127.0.0.1") as server:
        assert server.port > 0
        assert value(scrape(server.url), "farm_test_things_total") == 3
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


def test_a_taken_port_is_a_one_line_error() -> None:
    from farm.errors import ConfigError

    with MetricsServer(CollectorRegistry(), 0, "127.0.0.1") as first:
        with pytest.raises(ConfigError, match="FARM_METRICS_PORT"):
            MetricsServer(CollectorRegistry(), first.port, "127.0.0.1").__enter__()


def test_json_log_lines_are_objects_with_extra_fields() -> None:
    record = logging.makeLogRecord({"name": "farm.worker", "levelname": "INFO", "msg": "job %s done",
                                    "args": ("abc",), "job_id": "abc"})
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "job abc done" and line["logger"] == "farm.worker" and line["job_id"] == "abc"
    assert line["level"] == "INFO" and line["ts"].endswith("+00:00")


@pytest.mark.slow
def test_worker_and_scheduler_endpoints_count_jobs_durations_heartbeats_and_steal(
        cluster_env: dict[str, str], example_onnx: Path, tmp_path: Path) -> None:
    from farm.db.models import Job
    from farm.db.session import session_scope
    from scheduler.enqueue import submit
    from schemas import ProfileRequest

    env = farm_env(**cluster_env, FARM_NOOP_JOBS="1", FARM_HEARTBEAT_S="0.2", FARM_METRICS_PORT="0",
                   FARM_METRICS_ADDR="127.0.0.1", FARM_LOG_FORMAT="json", FARM_RECONCILE_INTERVAL_S="0.2")
    wlog, slog = tmp_path / "worker.log", tmp_path / "scheduler.log"
    worker = start_worker(env, "--runner", "process", log=wlog)
    sched = subprocess.Popen([sys.executable, "-m", "farm", "scheduler"], env=env, stdout=open(slog, "w"),  # noqa: SIM115
                             stderr=subprocess.STDOUT, text=True)
    try:
        wurl, surl = metrics_url(wlog, worker), metrics_url(slog, sched)
        sub = submit(ProfileRequest(model=str(example_onnx), batch_sizes=[1, 2, 4]))
        assert wait_done(sub.request_id, env) == {"succeeded": 3}
        w, s = scrape(wurl), scrape(surl)
        time.sleep(0.5)
        later = scrape(wurl)
    finally:
        for p in (worker, sched):
            p.send_signal(signal.SIGTERM)
        for p in (worker, sched):
            p.wait(timeout=60)
    # the worker: its jobs by queue and status, their durations, heartbeats, the host's steal counters
    assert value(w, "farm_worker_jobs_total", queue="farm.cpu", status="succeeded") == 3
    assert value(w, "farm_job_duration_seconds_count", queue="farm.cpu", status="succeeded") == 3
    assert value(w, "farm_job_duration_seconds_sum", queue="farm.cpu", status="succeeded") > 0  # type: ignore[operator]
    assert value(w, "farm_worker_busy") == 0
    beats = value(w, "farm_worker_heartbeats_total")
    assert beats is not None and beats >= 1 and value(later, "farm_worker_heartbeats_total") > beats  # type: ignore[operator]
    assert value(w, "farm_worker_last_heartbeat_timestamp_seconds") > 0  # type: ignore[operator]
    steal, total = value(w, "farm_host_cpu_steal_seconds_total"), value(w, "farm_host_cpu_seconds_total")
    assert steal is not None and total is not None and 0 <= steal <= total
    # the scheduler: the ledger's jobs by queue and state (as the database says), workers, its passes
    with session_scope() as db:
        queues = {q for (q,) in db.query(Job.queue).filter(Job.request_id == sub.request_id)}
    assert queues == {"farm.cpu"} and value(s, "farm_jobs", queue="farm.cpu", status="succeeded") == 3
    assert value(s, "farm_ledger_up") == 1 and value(s, "farm_workers", status="online") == 1
    assert [k for k in s if k[0] == "farm_worker_heartbeat_age_seconds"]
    assert value(s, "farm_scheduler_passes_total", outcome="ok") >= 1  # type: ignore[operator]
    assert value(s, "farm_host_cpu_seconds_total") is not None
    # FARM_LOG_FORMAT=json: the scheduler's log lines are JSON objects
    lines = [json.loads(line) for line in slog.read_text().splitlines() if line.startswith("{")]
    assert any(x["logger"] == "farm.scheduler" and "reconciling every" in x["message"] for x in lines)


@pytest.mark.slow
def test_celery_worker_sends_task_events_and_heartbeats(cluster_env: dict[str, str], example_onnx: Path,
                                                       tmp_path: Path) -> None:
    """What Flower reads: worker-heartbeat and task-* events from a real ``farm worker``."""
    from farm.broker import get_app
    from scheduler.enqueue import submit
    from schemas import ProfileRequest

    env = farm_env(**cluster_env, FARM_NOOP_JOBS="1")
    app = get_app()
    events: list[dict[str, Any]] = []
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": events.append})
        thread = threading.Thread(target=receiver.capture, kwargs={"limit": None, "timeout": None}, daemon=True)
        thread.start()
        worker = start_worker(env, "--runner", "process", log=tmp_path / "worker.log")
        try:
            sub = submit(ProfileRequest(model=str(example_onnx), batch_sizes=[1]))
            assert wait_done(sub.request_id, env) == {"succeeded": 1}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not {"worker-heartbeat", "task-succeeded"} <= {
                    e["type"] for e in events}:
                time.sleep(0.2)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
            receiver.should_stop = True
    kinds = {e["type"] for e in events}
    assert {"worker-online", "worker-heartbeat", "task-received", "task-started", "task-succeeded"} <= kinds, kinds
    received = [e for e in events if e["type"] == "task-received"]
    assert received[0]["name"] == "farm.run_job"


def test_a_scrape_during_a_database_outage_says_the_ledger_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import generate_latest

    from farm.settings import reset_settings
    from farm.telemetry import SchedulerMetrics

    monkeypatch.setenv("FARM_DATABASE_URL", "postgresql+psycopg2://farm@127.0.0.1:1/farm")  # nothing listens
    reset_settings()
    text = generate_latest(SchedulerMetrics().registry).decode()
    assert "farm_ledger_up 0.0" in text and "farm_jobs{" not in text
    assert "farm_host_cpu_seconds_total" in text  # the rest of the endpoint still answers

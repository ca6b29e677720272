"""The cluster stack: real Redis, real Postgres, real ``farm worker`` processes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import func, select

from farm.broker import Broker
from farm.db.models import Job, Result, Worker
from farm.db.session import session_scope
from scheduler.enqueue import submit
from schemas import ProfileRequest
from tests.helpers import farm, farm_env, start_worker, submit_to_worker

pytestmark = pytest.mark.slow

RESULT_KEYS = {"job_id", "device", "engine", "batch_size", "concurrency", "edge_profile", "status",
               "throughput_infer_per_s", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "error"}


def test_two_job_request_runs_to_completion_on_a_worker_process(cluster_env: dict[str, str], example_onnx: Path,
                                                                tmp_path: Path) -> None:
    env = farm_env(**cluster_env)
    counts, rows = submit_to_worker(env, [str(example_onnx), "--batch-sizes", "1,4"], tmp_path / "worker.log")
    assert counts == {"succeeded": 2}, (tmp_path / "worker.log").read_text()[-3000:]
    assert len(rows) == 2 and RESULT_KEYS <= set(rows[0])
    for row in rows:
        assert row["status"] == "succeeded" and row["error"] is None
        assert row["throughput_infer_per_s"] > 0
        assert 0 < row["latency_p50_ms"] <= row["latency_p95_ms"] <= row["latency_p99_ms"]
    assert sorted(r["batch_size"] for r in rows) == [1, 4]
    workers = json.loads(farm("workers", "--json", env=env).stdout)
    assert len(workers) == 1 and workers[0]["status"] == "offline"
    assert "farm.cpu" in workers[0]["queues"] and workers[0]["cpu"]["logical_cores"] >= 1


def test_same_job_delivered_twice_yields_one_result(cluster_env: dict[str, str], example_onnx: Path,
                                                    tmp_path: Path) -> None:
    sub = submit(ProfileRequest(model=str(example_onnx),
                                measurement={"max_windows": 3, "window_s": 0.3, "warmup_s": 0.2}), send=False)
    job = sub.expansion.jobs[0]
    Broker().send(job.job_id, job.queue)
    Broker().send(job.job_id, job.queue)  # a redelivery, as after a visibility timeout
    env = farm_env(**cluster_env)
    workers = [start_worker(env, "--burst", "--runner", "process", log=tmp_path / f"w{i}.log") for i in range(2)]
    for w in workers:
        assert w.wait(timeout=240) == 0
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Result).where(Result.job_id == job.job_id)) == 1
        row = s.get(Job, job.job_id)
        assert (row.status, row.attempts) == ("succeeded", 1)
        assert s.scalar(select(func.count()).select_from(Worker)) == 2

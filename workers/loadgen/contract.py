"""The load-client contract: what a client is given (:class:`LoadJob`, a ``WindowPlan``), what it hands back
(:class:`LoadRecord`: typed per-window figures and run totals) and the interface every client implements
(:class:`LoadClient`). ``result.to_result`` turns a record into the job's metrics and details, the same way
for every client; ``clients`` picks the client. Latencies in ms, times in s."""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from schemas import JobSpec, MeasurementSettings, TensorSpec
from schemas.engines import Protocol
from schemas.input_data import InputData
from schemas.load import LoadDetails
from schemas.load_levels import LoadLevel, load_level
from workers.loadgen import stats
from workers.loadgen.patterns import LoadPattern, pattern_of
from workers.loadgen.plan import WindowPlan


@dataclass(frozen=True)
class LoadTarget:
    """Where the load goes: the server at ``url`` (``host:port``) serving ``model_name``. An endpoint job
    (``farm.egress``): ``url`` holds the address its name was pinned to, ``authority`` the name (HTTP Host header,
    TLS), ``in_flight_cap`` the most requests it may keep in flight."""

    url: str
    model_name: str
    authority: str | None = None
    in_flight_cap: int | None = None


def settle_protocol(given: Protocol | None, settings: MeasurementSettings) -> Protocol:
    """The protocol a load speaks: ``given`` (a job's ``JobSpec.protocol``, set at expansion from its engine's
    card), or for a caller without a job (benchmarks, tests) OpenAI where ``settings.llm`` is set, else KServe."""
    return given or ("openai" if settings.llm is not None else "kserve")


@dataclass(frozen=True)
class LoadSpec:
    """What to send: requests of ``batch_size`` built from ``inputs`` (``data``: which values; None: random),
    offered at ``load`` and measured as ``settings`` say (their ``mode``/``rate`` unread: ``load`` holds them),
    over ``protocol`` (the job's; None: :func:`settle_protocol` from ``settings``)."""

    inputs: tuple[TensorSpec, ...]
    batch_size: int
    load: LoadLevel
    settings: MeasurementSettings
    data: InputData | None = None
    protocol: Protocol | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "protocol", settle_protocol(self.protocol, self.settings))

    @classmethod
    def of(cls, spec: JobSpec) -> LoadSpec:
        """A job's load."""
        return cls(tuple(spec.inputs), spec.batch_size, spec.load, spec.measurement, spec.input_data, spec.protocol)

    @classmethod
    def from_settings(cls, inputs: Sequence[TensorSpec], batch_size: int, concurrency: int,
                      settings: MeasurementSettings, data: InputData | None = None) -> LoadSpec:
        """The load of request-style ``settings`` at ``concurrency`` (their ``mode``/``rate`` as the expansion
        reads them, ``schemas.load_levels.load_level``): for callers without a job (benchmarks, tests)."""
        return cls(tuple(inputs), batch_size, load_level(settings.mode, concurrency, settings.rate), settings, data)


@dataclass(frozen=True)
class LoadJob:
    """One measurement to run: the KServe v2 gRPC server at ``url`` (``host:port``) serving ``model_name``,
    requests of ``batch_size`` built from ``inputs`` (``data``: which values; None: random, ``seed``),
    offered at ``load`` (each client translates it into its own terms; farm's generators: :attr:`pattern`).
    ``processes`` and ``in_process`` steer farm's generator only (its client processes; None: one, more when it
    cannot keep up; a single one as a thread of this process). An endpoint job (``farm.egress``): ``url`` holds
    the address its name was pinned to, ``authority`` the name (HTTP Host header, TLS), ``in_flight_cap`` the most
    requests it may keep in flight. ``protocol``: the job's (``JobSpec.protocol``; None: :func:`settle_protocol`
    from ``settings``), which picks the clients that speak it."""

    url: str
    model_name: str
    inputs: tuple[TensorSpec, ...]
    batch_size: int
    load: LoadLevel
    settings: MeasurementSettings
    data: InputData | None = None
    seed: int = 0
    connect_timeout_s: float = 10.0
    processes: int | None = None
    in_process: bool = False
    authority: str | None = None
    in_flight_cap: int | None = None
    protocol: Protocol | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "protocol", settle_protocol(self.protocol, self.settings))

    @property
    def pattern(self) -> LoadPattern:
        """The send pattern of farm's generators (kserve and OpenAI) for ``load``."""
        return pattern_of(self.load)


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One measurement window as a result keeps it (``details["windows"]``, judged for stability): window
    ``k`` starting ``t_s`` after the warm-up, ``length_s`` long, its successful ``requests`` and ``errors``,
    rates and mean/p50/p99 latency (ms; None without a request)."""

    k: int
    t_s: float
    length_s: float
    requests: int
    errors: int
    requests_per_s: float
    throughput_infer_per_s: float
    mean_ms: float | None
    p50_ms: float | None
    p99_ms: float | None

    @classmethod
    def measure(cls, k: int, t_s: float, length_s: float, lat_ms: np.ndarray, errors: int,
                batch_size: int) -> WindowFigures:
        """The figures of window ``k`` from its latencies (ms) and error count."""
        p50, p99 = stats.percentiles(lat_ms, (50, 99))
        return cls(k=k, t_s=t_s, length_s=length_s, requests=int(lat_ms.size), errors=errors,
                   requests_per_s=lat_ms.size / length_s, throughput_infer_per_s=lat_ms.size * batch_size / length_s,
                   mean_ms=stats.mean(lat_ms), p50_ms=p50, p99_ms=p99)

    def public(self) -> dict[str, Any]:
        """The stored form."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunTotals:
    """A run gathered for its metrics: the successful requests' latencies and the server's queue and compute
    times (ms) in the windows the metrics use and their length (s); over every window: error counts by status,
    sends, late sends, each client process's CPU busy % and whether the run was stable."""

    lat_ms: np.ndarray
    queue_ms: np.ndarray
    compute_ms: np.ndarray
    duration_s: float
    errors: dict[str, int]
    sent: int
    late: int
    busy_by_process: list[float]
    stable: bool


@dataclass(frozen=True)
class ClientDetails:
    """A client's own entries in the result's details, beyond the ones every client records: a subclass's
    fields, stored under their names."""

    def details(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class LoadRecord:
    """What a client measured, for ``result.to_result``: who measured (``client``, its ``label`` in notes,
    ``client_process``: where it ran), how (``rpc``, ``processes``), its windows and the ones the metrics use,
    the totals, whether it stopped early on stability, the warm-up's successful requests, its own notes (before
    the ones every result gets), its own details and its own metrics (registry names, e.g. the LLM figures)."""

    client: str
    label: str
    client_process: str
    rpc: str
    processes: int
    windows: list[WindowFigures]
    metric_windows: slice
    totals: RunTotals
    stopped_when_stable: bool
    warmup_requests: int
    notes: list[str] = field(default_factory=list)
    own: ClientDetails = field(default_factory=ClientDetails)
    metrics: dict[str, float | int | bool | None] = field(default_factory=dict)  # the client's own metrics


@dataclass
class LoadResult:
    """What one load run measured. ``metrics`` are keyed by ``schemas.metrics`` names (None: not measured);
    ``details`` hold the latency histogram, per-window series, error counts by gRPC status and the
    mode/rate/concurrency/process count used."""

    metrics: dict[str, float | int | bool | None]
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def typed(self) -> LoadDetails:
        """``details`` as its readers see them (``schemas.load``); ``details`` stay what the result stores."""
        return LoadDetails.model_validate(self.details)


class LoadClient(ABC):
    """A load client. ``name``: the job's ``settings.client`` and the details' ``client``; ``label``: how a
    result's notes name it; ``title``: how the note of a fallback to it does; ``stops_when_stable``: whether
    it can end a run once stable (its window plan then runs up to ``max_windows``)."""

    name: ClassVar[str]
    label: ClassVar[str]
    title: ClassVar[str]
    stops_when_stable: ClassVar[bool]

    def why_not(self, job: LoadJob) -> str | None:
        """Why this client cannot measure ``job`` here (one line saying what to do), None when it can; may
        keep what it learned for :meth:`run`."""
        return None

    @abstractmethod
    def run(self, job: LoadJob, plan: WindowPlan) -> LoadRecord:
        """Measure ``job`` through ``plan``; raise LoadGenError when it cannot or measured nothing."""

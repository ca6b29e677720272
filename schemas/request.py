"""The profiling request: what the user asks farm to measure."""
from __future__ import annotations

import itertools
import math
import re
from typing import Any, Literal, get_args

from pydantic import Field, StrictInt, field_validator, model_validator

from schemas.engines import ENDPOINT_ENGINE, ENGINES, ModelFormat
from schemas.input_data import InputData
from schemas.knobs import KnobValue
from schemas.llm import LlmSettings, split_endpoint
from schemas.llm_engines import check_knobs, typed_knob
from schemas.specs import EdgeProfile, StrictModel, TensorSpec, parse_memory

_ENDPOINT_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9][A-Za-z0-9_.-]*):\d{1,5}$")
_DEVICE_RE = re.compile(r"^(cpu|gpu(:[a-z0-9][a-z0-9_.-]{0,62})?)$")


def device_slug(name: str) -> str:
    """Turn a GPU product name (``NVIDIA A100-SXM4-40GB``) into a queue-safe slug (``a100-sxm4-40gb``)."""
    s = name.lower()
    for prefix in ("nvidia ", "tesla ", "geforce "):
        if s.startswith(prefix):
            s = s[len(prefix):]
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "unknown"


#: the load clients a request may name: ``auto`` (chosen per job by workers.loadgen.clients) and each client
#: registered in ``workers.loadgen.clients.CLIENTS`` (a test keeps the two in step)
LoadClientName = Literal["auto", "farm", "perf_analyzer", "openai"]
LOAD_CLIENTS: tuple[str, ...] = get_args(LoadClientName)


#: the searches a request may ask for (``MeasurementSettings.search``): none (brute force), the quick search over
#: the listed levels, and the LLM max-goodput search over a continuous rate
SearchKind = Literal["brute", "quick", "max-goodput"]
GOODPUT_START_RATE = 1.0  # the first rate of a max-goodput search given no --rate, requests/s


def _goodput_open_loop(data: object) -> object:
    """A max-goodput search measures Poisson arrivals: a closed-loop measurement becomes ``poisson`` at its
    rate, or ``GOODPUT_START_RATE`` (a new dict; anything else is left to the checks)."""
    if (isinstance(data, dict) and data.get("search") == "max-goodput"
            and data.get("mode", "closed") == "closed"):
        return {**data, "mode": "poisson", "rate": data.get("rate") or GOODPUT_START_RATE}
    return data


class MeasurementSettings(StrictModel):
    """How each job is measured. Times in seconds; percentages in %."""

    mode: Literal["closed", "constant", "poisson", "trace"] = "closed"
    rate: float | None = Field(default=None, gt=0, description="requests/s for open-loop modes")
    # 0.5 s: a cold first window fails the stability rule and is measured again, so a longer warm-up only
    # adds to every configuration's wall time (perf_analyzer has none)
    warmup_s: float = Field(default=0.5, ge=0, le=600)
    window_s: float = Field(default=1.0, gt=0, le=600)
    min_windows: int = Field(default=3, ge=1, le=1000)
    max_windows: int = Field(default=10, ge=1, le=1000)
    stability_pct: float = Field(default=10.0, gt=0, le=100)
    stability_latency: Literal["mean", "p50", "p99"] = Field(
        default="mean",
        description="the latency that must agree across the last min_windows windows, with throughput: the mean "
                    "(perf_analyzer's default rule), p50, or p99 (perf_analyzer's --percentile 99: a 1 s window "
                    "holds few requests above its p99, so it needs more windows on a noisy host)")
    duration_s: float | None = Field(default=None, gt=0, le=3600,
                                     description="fixed measurement time; disables stability windows")
    timeout_s: float = Field(default=600.0, gt=0, le=86400, description="per-job time limit")
    threads: int = Field(default=0, ge=0, le=256, description="server intra-op threads, 0 = engine default "
                         "(farm's built-in server: one per leased core)")
    instances: int = Field(default=1, ge=1, le=64, description="server model instances")
    max_queue_delay_us: int | None = Field(
        default=None, ge=0, le=10_000_000,
        description="dynamic batching: how long the server waits to merge requests, µs; None = off")
    preferred_batch_size: int | None = Field(
        default=None, ge=1, le=65536, description="dynamic batching: run a batch as soon as it has this many rows")
    search: SearchKind = Field(
        default="brute", description="brute: every concurrency (or rate); quick: per serving configuration, the "
                                     "scheduler walks concurrency (open loop: the rates) up, or binary-searches "
                                     "it under p99_ms; max-goodput (LLM, with an SLO): per serving configuration, "
                                     "the highest Poisson request rate keeping >= 95 % of requests within the SLO, "
                                     "found by doubling then bisecting the rate from measurement.rate")
    p99_ms: float | None = Field(default=None, gt=0, le=600_000, description="latency budget of the quick search, ms")
    rpc: Literal["unary", "stream"] = Field(
        default="unary",
        description="how the load generator calls the server: unary ModelInfer calls (what most clients "
                    "do) or ModelStreamInfer streams (cheaper per request on both ends)")
    op_profile: bool = Field(
        default=False,
        description="after each job's load measurement, a separate short pass with the engine's own op profiler "
                    "on (same engine, device, batch, threads and cores): the time per graph node, `farm ops JOB`")
    client: LoadClientName = Field(
        default="auto",
        description="which client sends the load: NVIDIA perf_analyzer (its C++ hot loop sends the tensors "
                    "farm's generator would, over unary calls, to a server answering ModelConfig; farm reads its "
                    "per-request export into the same warm-up, windows and figures), farm's own generator "
                    "(streams too, and the server's per-request queue/compute percentiles; at low concurrency "
                    "its Python cost shows in the figures), or auto: perf_analyzer where it is installed and "
                    "can run the job, else farm's generator. The result says which one measured it")

    llm: LlmSettings | None = Field(default=None, description="an LLM server driven over the OpenAI API "
                                    "(schemas.llm); None: KServe v2")
    server_memory: int | None = Field(default=None, ge=4 << 20, description="the memory limit of the model server "
                                      "farm starts for each job, bytes or 512m/4g (its cgroup or container); None: "
                                      "the worker's FARM_SERVER_MEMORY, which also caps a larger value")

    @field_validator("server_memory", mode="before")
    @classmethod
    def _memory(cls, v: object) -> object:
        return parse_memory(v) if isinstance(v, str) else v

    @model_validator(mode="before")
    @classmethod
    def _rate_opens_the_loop(cls, data: object) -> object:
        """A rate without an open-loop mode measures at that constant rate (a new input, nothing mutated); a
        max-goodput search at Poisson arrivals."""
        data = _goodput_open_loop(data)
        if isinstance(data, dict) and data.get("rate") is not None and data.get("mode", "closed") == "closed":
            return {**data, "mode": "constant"}
        return data

    @model_validator(mode="after")
    def _check(self) -> MeasurementSettings:
        if self.llm is not None and self.client not in ("auto", "openai"):
            raise ValueError(f"an LLM job (--api) is measured by the openai client, not {self.client}")
        if self.llm is None and self.client == "openai":
            raise ValueError("client openai drives LLM servers: name the API, --api openai-chat|openai-completions")
        if self.mode != "closed" and self.rate is None:
            raise ValueError(f"mode {self.mode!r} needs a rate (requests/s)")
        self._check_trace()
        if self.max_windows < self.min_windows:
            raise ValueError(f"max_windows ({self.max_windows}) must be >= min_windows ({self.min_windows})")
        if self.search == "max-goodput":
            self._check_goodput()
        if self.p99_ms is not None and self.search != "quick":
            raise ValueError("p99_ms (--p99) is the quick search's latency budget: add search quick (--search quick), "
                             "or rank by p99 afterwards with `farm report --p99`")
        return self

    def _check_trace(self) -> None:
        """Mode ``trace`` and ``llm.trace`` go together (``--trace FILE`` sets the mode, its rate and its count)."""
        traced = self.llm is not None and self.llm.trace is not None
        if self.mode == "trace" and not traced:
            raise ValueError("mode trace replays a request trace: give --trace FILE with --api (it sets the mode)")
        if traced and self.mode != "trace":
            raise ValueError(f"a trace (--trace) is sent on its own schedule: drop --mode {self.mode} and --rate")
        if traced and self.search != "brute":
            raise ValueError(f"a trace (--trace) is replayed as it is: drop --search {self.search}")

    def _check_goodput(self) -> None:
        if self.llm is None:
            raise ValueError("--search max-goodput searches an LLM server's request rate: give a .gguf or Hugging "
                             "Face model, or --endpoint http://HOST:PORT --api openai-chat, with --slo ttft=MS,tpot=MS")
        if self.llm.slo is None:
            raise ValueError("--search max-goodput needs the latency goals requests must meet: add --slo "
                             "ttft=MS,tpot=MS[,e2e=MS]")
        if self.mode != "poisson":
            raise ValueError(f"--search max-goodput measures Poisson arrivals: drop --mode {self.mode} "
                             "(it sets --mode poisson itself)")
        if self.llm.requests is not None:
            raise ValueError("--search max-goodput measures each rate over the windows: drop --requests")


#: every measurement setting's default (the one place: ``MeasurementSettings``' fields)
MEASUREMENT_DEFAULTS: dict[str, Any] = {k: f.default for k, f in MeasurementSettings.model_fields.items()}
#: the serving-configuration keys of a job's ``measurement`` (columns of results, report groups)
SERVING_KEYS: tuple[str, ...] = ("instances", "threads", "max_queue_delay_us", "preferred_batch_size")
#: the plain serving configuration: every ``SERVING_KEYS`` at its default (1 instance, engine defaults)
PLAIN_SERVING: dict[str, Any] = {k: MEASUREMENT_DEFAULTS[k] for k in SERVING_KEYS}
#: a job's load level: closed-loop concurrency and the open-loop rate (requests/s; None in closed loop), each
#: a ``JobSpec`` attribute and a ``jobs`` column. A quick search walks one of them; a serving configuration
#: excludes both
LOAD_KEYS: tuple[str, ...] = ("concurrency", "rate")
#: a results row's coordinates after the job's own columns: the serving keys of its ``measurement`` and its
#: rate
MEASUREMENT_KEYS: tuple[str, ...] = (*SERVING_KEYS, "rate")
#: a job's coordinates in the matrix, in matrix order: what results, reports and comparisons group by (a
#: serving configuration is all of them but the ``LOAD_KEYS`` and edge_profile)
COORDINATE_KEYS: tuple[str, ...] = ("device", "engine", "batch_size", *SERVING_KEYS, *LOAD_KEYS, "edge_profile")
MAX_RATE = 1_000_000.0  # the highest open-loop rate a request may ask for, requests/s
MAX_REPEATS = 20  # the most runs of each cell one request may ask for (``repeats``)


def _positive_unique(name: str, values: list[int], upper: int, lower: int = 1) -> list[int]:
    if not values:
        raise ValueError(f"{name} must not be empty")
    for v in values:
        if isinstance(v, bool) or v < lower or v > upper:
            raise ValueError(f"{name} must be whole numbers from {lower} to {upper}, got {v}")
    return sorted(set(values))


def _one_rate_list(data: object) -> object:
    """A request dict whose open-loop rates are in ``rates``, the one list expansion reads (like
    ``concurrency``): ``measurement.rate`` alone becomes ``rates: [R]``; a ``rates`` list gives a measurement
    without a rate its first one, which makes it open loop (each job gets its own rate at expansion). A new
    dict; anything unusable is left for the fields' own validators to explain."""
    if not isinstance(data, dict):
        return data
    m = data.get("measurement")
    if isinstance(m, MeasurementSettings):
        m = m.model_dump(exclude_unset=True)
    if not isinstance(m, dict | None):
        return data
    m = dict(m or {})
    rates = data.get("rates")
    if rates is None and m.get("rate") is not None:
        return {**data, "rates": [m["rate"]]}
    first = rates[0] if isinstance(rates, list) and rates else rates
    try:
        first = None if isinstance(first, bool) else float(first)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        first = None
    if first is None or not first > 0 or m.get("rate") is not None:
        return data
    return {**data, "measurement": {**m, "rate": first}}


def _llm_endpoint(data: object) -> object:
    """An ``http://HOST:PORT[/PATH]`` endpoint of an LLM request as ``HOST:PORT``, its path and scheme moved
    to ``measurement.llm`` (a new dict); an http endpoint without ``measurement.llm`` is refused."""
    if not isinstance(data, dict) or not isinstance(data.get("endpoint"), str) or "://" not in data["endpoint"]:
        return data
    m = data.get("measurement")
    if isinstance(m, MeasurementSettings):
        m = m.model_dump(exclude_unset=True)
    llm = m.get("llm") if isinstance(m, dict) else None
    if isinstance(llm, LlmSettings):
        llm = llm.model_dump(exclude_unset=True)
    if not isinstance(llm, dict):
        raise ValueError(f"endpoint {data['endpoint']} is an HTTP URL: say which API it serves with --api "
                         "openai-chat|openai-completions (KServe v2 gRPC endpoints are HOST:PORT)")
    hostport, path, tls = split_endpoint(data["endpoint"])
    assert isinstance(m, dict)
    return {**data, "endpoint": hostport, "measurement": {**m, "llm": {**llm, "base_path": path, "tls": tls}}}


class ProfileRequest(StrictModel):
    """What to profile: one model over devices x engines x batch sizes x serving configurations x concurrency
    (x open-loop rates), plus edge runs."""

    model: str | None = Field(default=None, min_length=1, max_length=4096,
                              description="path of the model file (none with endpoint)")
    format: ModelFormat | None = None  # the cards' formats (schemas.engines); gguf, hf: LLM models
    inputs: list[TensorSpec] | None = None
    devices: list[str] = Field(default_factory=lambda: ["cpu"])
    engines: list[str] = Field(default_factory=lambda: ["onnxruntime"])
    batch_sizes: list[StrictInt] = Field(default_factory=lambda: [1])
    concurrency: list[StrictInt] = Field(default_factory=lambda: [1])
    edge: list[EdgeProfile] = Field(default_factory=list)
    # serving-configuration dimensions (lists; None: the scalar in ``measurement``), one job per combination
    instances: list[StrictInt] | None = None
    threads: list[StrictInt] | None = None
    max_queue_delay_us: list[StrictInt] | None = None
    # open-loop rates, requests/s (None: closed loop; ``measurement.rate`` alone is one rate), one job per rate
    rates: list[float] | None = None
    measurement: MeasurementSettings = Field(default_factory=MeasurementSettings)
    # runs of each cell, interleaved: round after round, the cells in a seeded shuffled order (scheduler.expand)
    repeats: StrictInt = Field(default=1, ge=1, le=MAX_REPEATS, description="runs of each cell (1 to 20)")
    name: str | None = Field(default=None, max_length=200)
    input_data: InputData | None = Field(default=None, description="random (default), zeros or a file's rows")
    endpoint: str | None = Field(default=None, max_length=300,
                                 description="HOST:PORT of a running KServe v2 gRPC server to profile")
    model_name: str | None = Field(default=None, min_length=1, max_length=256,
                                   description="the model to profile on the endpoint")
    # an LLM engine's knobs as matrix dimensions (schemas.llm_engines): name -> values, one job per combination
    knobs: dict[str, list[KnobValue]] | None = None

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("devices must not be empty; allowed: cpu, gpu, gpu:<product>")
        out: list[str] = []
        for d in v:
            d = d.strip().lower()
            if not _DEVICE_RE.match(d):
                raise ValueError(f"device {d!r} is unknown; allowed: cpu, gpu, gpu:<product> (e.g. gpu:a100)")
            if d not in out:
                out.append(d)
        return out

    @field_validator("engines")
    @classmethod
    def _engines(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"engines must not be empty; allowed: {', '.join(ENGINES)}")
        out: list[str] = []
        for e in v:
            e = e.strip().lower()
            if e not in ENGINES and e != ENDPOINT_ENGINE:
                raise ValueError(f"engine {e!r} is unknown; allowed: {', '.join(ENGINES)}")
            if e not in out:
                out.append(e)
        return out

    @field_validator("batch_sizes")
    @classmethod
    def _batches(cls, v: list[int]) -> list[int]:
        return _positive_unique("batch_sizes", v, 65536)

    @field_validator("concurrency")
    @classmethod
    def _conc(cls, v: list[int]) -> list[int]:
        return _positive_unique("concurrency", v, 4096)

    @model_validator(mode="before")
    @classmethod
    def _rates_open_loop(cls, data: object) -> object:
        return _one_rate_list(data)

    @model_validator(mode="before")
    @classmethod
    def _llm_endpoint(cls, data: object) -> object:
        return _llm_endpoint(data)

    @model_validator(mode="before")
    @classmethod
    def _endpoint_engine(cls, data: object) -> object:
        """An endpoint request without engines runs the endpoint's own (a new input, nothing mutated)."""
        if isinstance(data, dict) and data.get("endpoint") is not None and "engines" not in data:
            return {**data, "engines": [ENDPOINT_ENGINE]}
        return data

    @field_validator("instances", "threads", "max_queue_delay_us", "rates", mode="before")
    @classmethod
    def _one_value(cls, v: object) -> object:
        # `instances: 2` (`rates: 100`) in a request file
        return [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("rates must not be empty; omit it for one measurement.rate (or closed loop)")
        for r in v:
            if not (math.isfinite(r) and 0 < r <= MAX_RATE):
                raise ValueError(f"rates must be requests/s above 0 and up to {MAX_RATE:g}, got {r:g}")
        return sorted(set(v))

    @field_validator("instances")
    @classmethod
    def _instances(cls, v: list[int] | None) -> list[int] | None:
        return None if v is None else _positive_unique("instances", v, 64)

    @field_validator("threads")
    @classmethod
    def _threads(cls, v: list[int] | None) -> list[int] | None:
        return None if v is None else _positive_unique("threads (0 = engine default)", v, 256, lower=0)

    @field_validator("max_queue_delay_us")
    @classmethod
    def _delays(cls, v: list[int] | None) -> list[int] | None:
        return None if v is None else _positive_unique("max_queue_delay_us", v, 10_000_000, lower=0)

    def rate_levels(self) -> list[float | None]:
        """The open-loop rates of the request's jobs, ascending (``[None]`` in closed loop)."""
        return list(self.rates) if self.rates else [None]

    def search_load(self) -> str:
        """What a quick search walks (one of ``LOAD_KEYS``): the rates in open loop, else concurrency."""
        return "concurrency" if self.measurement.mode == "closed" else "rate"

    def search_levels(self) -> list[int] | list[float]:
        """The levels a quick search walks, ascending: the concurrency list, or in open loop the rates."""
        if self.search_load() == "concurrency":
            return list(self.concurrency)
        return [r for r in self.rate_levels() if r is not None]

    def serving_configs(self) -> list[dict[str, int | None]]:
        """The serving-configuration combinations (instances x threads x queue delay), each a dict of the
        ``SERVING_KEYS`` a job's measurement holds."""
        m = self.measurement
        delays: list[int | None] = [m.max_queue_delay_us]
        if self.max_queue_delay_us:
            delays = list(self.max_queue_delay_us)
        return [{"instances": i, "threads": t, "max_queue_delay_us": d, "preferred_batch_size": m.preferred_batch_size}
                for i in (self.instances or [m.instances]) for t in (self.threads or [m.threads])
                for d in delays]

    @field_validator("knobs", mode="before")
    @classmethod
    def _knob_lists(cls, v: object) -> object:
        # `knobs: {n_parallel: 4}` in a request file
        return {k: x if isinstance(x, list) else [x] for k, x in v.items()} if isinstance(v, dict) else v

    @model_validator(mode="after")
    def _knobs(self) -> ProfileRequest:
        """Every knob is one of each named engine's (an engine left to the model's format: of some LLM engine's),
        each value of its type; an empty list is refused."""
        for name, values in (self.knobs or {}).items():
            if not values:
                raise ValueError(f"knob {name} has no values; give NAME=V1[,V2...]")
            for value in values:
                if "engines" not in self.model_fields_set:  # the engine follows the model's format (expansion)
                    typed_knob(name, value)
                for engine in self.engines if "engines" in self.model_fields_set else ():
                    check_knobs(engine, {name: value})
        return self

    def knob_configs(self) -> list[dict[str, KnobValue]]:
        """The knob combinations, one dict per job (``[{}]`` without knobs), in a stable order."""
        names = sorted(self.knobs or {})
        return [dict(zip(names, combo, strict=True))
                for combo in itertools.product(*([typed_knob(n, v) for v in (self.knobs or {})[n]] for n in names))]

    @field_validator("edge")
    @classmethod
    def _edge(cls, v: list[EdgeProfile]) -> list[EdgeProfile]:
        names = [p.name for p in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"edge profile names must be unique; repeated: {', '.join(sorted(dup))}")
        return v

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, v: list[TensorSpec] | None) -> list[TensorSpec] | None:
        if v is not None:
            names = [t.name for t in v]
            if len(set(names)) != len(names):
                raise ValueError("inputs must have unique names")
            if not v:
                raise ValueError("inputs must not be empty when given; omit it to infer from the model")
        return v

    @model_validator(mode="after")
    def _open_loop(self) -> ProfileRequest:
        """A rates list and measurement.rate must agree; an open-loop quick search walks the rates at one
        concurrency; a quick search runs each step once (no repeats)."""
        m = self.measurement
        if self.rates and m.rate not in self.rates:
            raise ValueError(f"measurement.rate {m.rate:g} is not one of rates; give the open-loop rate once "
                             "(rates: [...] or measurement.rate)")
        if m.search == "max-goodput" and (len(self.rates or []) > 1 or len(self.concurrency) > 1):
            raise ValueError("--search max-goodput finds the rate itself: give at most one --rate (its first step, "
                             f"default {GOODPUT_START_RATE:g} req/s) and one --concurrency")
        if m.search != "brute" and self.repeats > 1:
            raise ValueError("repeats and a quick search do not combine (each search step is one run): use "
                             "--search brute with --repeats, or drop --repeats")
        if m.search == "quick" and m.mode != "closed" and len(self.concurrency) > 1:
            raise ValueError("an open-loop quick search walks the rates (--rate 50,100,200) at one concurrency: "
                             "give one --concurrency, or use --search brute")
        return self

    @model_validator(mode="after")
    def _model_or_endpoint(self) -> ProfileRequest:
        """A model file, or an endpoint and model name (engine ``endpoint``, no format, no edge runs)."""
        if self.endpoint is None:
            if self.model is None:
                raise ValueError("give a model file (model), or an endpoint and model_name to profile a running server")
            if self.measurement.llm is not None and self.measurement.llm.credential is not None:
                raise ValueError("a credential is sent to an endpoint (--endpoint): a server farm starts needs none, "
                                 "and never sees an operator's secret")
            if ENDPOINT_ENGINE in self.engines or self.model_name is not None:
                raise ValueError("engine endpoint and model_name go with an endpoint (--endpoint HOST:PORT)")
            return self
        if not _ENDPOINT_RE.match(self.endpoint):
            raise ValueError(f"endpoint {self.endpoint!r} is not HOST:PORT (e.g. 10.0.0.5:8001)")
        if self.model is not None or self.format is not None or self.edge:
            raise ValueError("an endpoint is profiled without a model file: drop the model, format and edge runs")
        if self.model_name is None:
            raise ValueError(f"endpoint {self.endpoint} needs model_name: the model to profile (--model-name)")
        if self.engines != [ENDPOINT_ENGINE]:
            raise ValueError(f"an endpoint runs its own engine: drop engines {', '.join(self.engines)}")
        return self

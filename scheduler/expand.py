"""Expansion of a request into jobs: pure functions, no I/O.

One job per (device x engine x batch size x serving configuration x concurrency x open-loop rate) plus one per
(edge profile x in-process engine x batch size), where a serving configuration is one combination of the
request's instances x threads x max queue delay (``ProfileRequest.serving_configs``), held by each job's
``measurement``, and a load level its ``load`` (``schemas.load_levels``: the concurrency, or the mode with one of
``ProfileRequest.rate_levels``; ``JobSpec.concurrency``/``rate``, stored in the ``jobs`` columns). A quick search
(``measurement.search == "quick"``) gets only the first step of each serving configuration (a concurrency, or
a rate in open loop); ``scheduler.search`` adds the next ones as results land. Job ids are deterministic from
the request id and the job's coordinates (and its repeat).

With ``repeats`` N > 1 every cell runs N times, interleaved (:func:`interleave`): round after round, each round
holding every cell once in its own shuffled order, so a slow phase of the host spreads over the cells instead of
hitting one cell's N back-to-back runs. Embedded mode runs the jobs in this order; cluster mode enqueues them in it.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, TypedDict

from farm.errors import RequestError
from scheduler.goodput_rules import round_rate, step_duration
from scheduler.search_rules import first_level
from schemas import JobSpec, ProfileRequest, TensorSpec
from schemas.engines import FORMAT_ENGINE, IN_PROCESS, default_engine, incompatibility, is_openai, llm_format
from schemas.input_data import InputData
from schemas.job import protocol_of
from schemas.llm import LlmSettings, cache_state_of
from schemas.llm_engines import check_knobs
from schemas.load_levels import load_level
from schemas.queues import EDGE_QUEUE, queue_for
from schemas.request import PLAIN_SERVING, device_slug


class JobCommon(TypedDict):
    """What every job of one request's expansion shares (its ``JobSpec`` fields)."""

    request_id: str
    model_sha256: str
    model_format: str
    model_filename: str
    inputs: list[TensorSpec]
    input_data: InputData | None


def job_id_for(request_id: str, device: str, engine: str, batch: int, concurrency: int,
               edge: str | None, serving: dict[str, Any] | None = None, knobs: dict[str, Any] | None = None) -> str:
    """A deterministic 32-hex-character job id from the request id and the coordinates (``serving``: the
    job's measurement, or its serving configuration and ``rate``; the plain one, 1 instance and engine
    defaults, adds nothing to the key, nor does a closed loop's absent rate)."""
    key = f"{request_id}|{device}|{engine}|b{batch}|c{concurrency}|edge={edge or ''}"
    if serving and {k: serving.get(k) for k in PLAIN_SERVING} != PLAIN_SERVING:
        key += "|" + ",".join(f"{k}={serving.get(k)}" for k in sorted(PLAIN_SERVING))
    if serving and serving.get("rate") is not None:
        key += f"|rate={float(serving['rate'])!r}"
    if knobs:  # an LLM engine's knobs (none: the key of a job without them is unchanged)
        key += "|knobs=" + ",".join(f"{k}={knobs[k]!r}" for k in sorted(knobs))
    if cache_state_of(serving) == "warm":  # a warm prefix cache (cold, the default, leaves the key unchanged)
        key += "|prefix_cache=warm"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def repeat_job_id(job_id: str, repeat: int) -> str:
    """The id of run ``repeat`` (0-based) of the cell whose first run is ``job_id``: ``job_id`` itself for run 0
    (a request without repeats keeps its ids), else a deterministic id of its own."""
    return job_id if repeat == 0 else hashlib.sha256(f"{job_id}|repeat={repeat}".encode()).hexdigest()[:32]


def interleave(jobs: list[JobSpec], repeats: int, seed: str) -> list[JobSpec]:
    """``repeats`` rounds of ``jobs`` (one per cell), each round in its own order, shuffled by a RNG seeded with
    ``seed`` (the request id: one request always gets the same order); round r's jobs carry ``repeat`` r and
    their own ids (:func:`repeat_job_id`). One round: ``jobs`` as they are."""
    if repeats <= 1:
        return jobs
    rng = random.Random(seed)  # noqa: S311 - an order, not a secret
    out: list[JobSpec] = []
    for r in range(repeats):
        order = list(jobs)
        rng.shuffle(order)
        out.extend(j.model_copy(update={"repeat": r, "job_id": repeat_job_id(j.job_id, r)}) for j in order)
    return out


@dataclass(frozen=True)
class ModelRef:
    """What expansion needs to know of the model artifact."""

    sha256: str
    format: str
    filename: str
    inputs: tuple[TensorSpec, ...]
    static_batch: int | None = None  # the model's batch dimension is fixed at this size


@dataclass
class Expansion:
    """Jobs to run and combinations left out, each with its reason."""

    jobs: list[JobSpec] = field(default_factory=list)
    excluded: list[dict[str, object]] = field(default_factory=list)


def resolve_devices(devices: list[str], gpu_products: list[str] | None) -> tuple[list[str], list[dict[str, object]]]:
    """Resolve device selectors against the GPU product names live workers advertise.

    ``cpu`` stays; ``gpu`` becomes one ``gpu:<slug>`` per distinct product online (excluded with a reason
    when none is); ``gpu:<name>`` becomes every online product whose slug contains ``<name>``, or stays
    as asked (its jobs wait in their queue until such a worker comes) when none matches.
    """
    slugs = sorted({device_slug(p) for p in (gpu_products or [])})
    out: list[str] = []
    excluded: list[dict[str, object]] = []
    for d in devices:
        if d == "cpu":
            resolved = ["cpu"]
        elif d == "gpu":
            resolved = [f"gpu:{s}" for s in slugs]
            if not resolved:
                excluded.append({"device": "gpu", "reason": "no worker with a GPU is online; name a product "
                                 "(e.g. --device gpu:a100) to queue jobs for workers yet to come"})
        else:
            want = d.split(":", 1)[1]
            resolved = [f"gpu:{s}" for s in slugs if want in s] or [f"gpu:{device_slug(want)}"]
        out.extend(r for r in resolved if r not in out)
    return out, excluded


def expand(request: ProfileRequest, request_id: str, model: ModelRef,
           gpu_products: list[str] | None = None) -> Expansion:
    """Expand ``request`` into jobs; incompatible combinations go to ``excluded`` with their reason."""
    devices, excluded = resolve_devices(request.devices, gpu_products)
    result = Expansion(excluded=excluded)
    common = JobCommon(request_id=request_id, model_sha256=model.sha256, model_format=model.format,
                       model_filename=model.filename, inputs=list(model.inputs), input_data=request.input_data)
    batches = [b for b in request.batch_sizes if model.static_batch in (None, b)]
    for b in request.batch_sizes:
        if b not in batches:
            result.excluded.append({"batch_size": b, "reason": f"the model's batch dimension is fixed at "
                                    f"{model.static_batch}; export it with a dynamic batch axis"})
    for device in devices:
        for engine in request_engines(request, model.format):
            reason = incompatibility(engine, model.format, device) or _api_mismatch(request, engine)
            if reason:
                result.excluded.append({"device": device, "engine": engine, "reason": reason})
                continue
            result.jobs.extend(_serving_jobs(request, device, engine, batches, common))
    _add_edge_jobs(result, request, model.format, batches, common)
    result.jobs = interleave(result.jobs, request.repeats, request_id)
    return result


def _llm_for(request: ProfileRequest, engine: str) -> LlmSettings | None:
    """The OpenAI-API settings of a job on ``engine``: the request's, or the defaults (chat API, 128 in / 128 out)
    for an LLM engine farm launches when the request gave no LLM option."""
    llm = request.measurement.llm
    return llm if llm is not None or not is_openai(engine) else LlmSettings()


def _cache_variants(request: ProfileRequest, engine: str) -> list[tuple[str | None, LlmSettings | None]]:
    """(prefix-cache state, LLM settings holding it alone) of each job of one cell on ``engine``: one per state
    the request asks for (cold and warm: two jobs); ``[(None, None)]`` for a job that is not an LLM one."""
    llm = _llm_for(request, engine)
    if llm is None:
        return [(None, None)]
    return [(s, llm.model_copy(update={"prefix_cache": [s]})) for s in llm.prefix_cache]


def cache_states(request: ProfileRequest) -> int:
    """How many prefix-cache states each LLM cell runs in (1 for a request that is not an LLM one)."""
    return len(request.measurement.llm.prefix_cache) if request.measurement.llm is not None else 1


def _api_mismatch(request: ProfileRequest, engine: str) -> str | None:
    """Why LLM options (``measurement.llm``) cannot apply to ``engine``; None where they can."""
    if request.measurement.llm is None or is_openai(engine) or request.endpoint is not None:
        return None
    return (f"{engine} serves KServe v2 tensors, not the OpenAI API: LLM options (--api, tokens, --slo) need an LLM "
            "model (.gguf or a Hugging Face folder)")


def _serving_jobs(request: ProfileRequest, device: str, engine: str, batches: list[int],
                  common: JobCommon) -> list[JobSpec]:
    """The serving jobs of one (device, engine): one per batch size x serving configuration x load level."""
    request_id = common["request_id"]
    jobs: list[JobSpec] = []
    knob_configs = request.knob_configs()
    try:
        for knobs in knob_configs:
            check_knobs(engine, knobs)
    except ValueError as exc:  # an engine chosen by the model's format, not named by the request
        raise RequestError(str(exc)) from None
    cells = [(b, serving, knobs, level) for b in batches for serving in request.serving_configs()
             for knobs in knob_configs for level in _levels(request)]
    for b, serving, knobs, (c, rate) in cells:
        for state, llm in _cache_variants(request, engine):
            m = request.measurement.model_copy(update={**serving, "rate": rate, "llm": llm,
                                                       **_step_time(request, rate)})
            jobs.append(JobSpec(
                job_id=job_id_for(request_id, device, engine, b, c, None,
                                  {**serving, "rate": rate, "prefix_cache": state}, knobs),
                device=device, engine=engine, protocol=protocol_of(engine, m.llm), batch_size=b,
                load=load_level(m.mode, c, rate),
                queue=queue_for(device), measurement=m, knobs=knobs, **common))
    return jobs


def request_engines(request: ProfileRequest, model_format: str) -> list[str]:
    """The request's engines; the model format's default engine (its card's, ``schemas.engines.default_engine``)
    when none was named (a TorchScript model without ``--engine`` was expanded for onnxruntime and refused)."""
    default = default_engine(model_format)
    if "engines" not in request.model_fields_set and default is not None:
        return [default]
    return list(request.engines)


def _add_edge_jobs(result: Expansion, request: ProfileRequest, model_format: str, batches: list[int],
                   common: JobCommon) -> None:
    """One edge job per (edge profile x in-process engine x batch size); a profile without an engine for the
    model's format is excluded. An LLM model's edge jobs are its CPU LLM engines' (:func:`_add_llm_edge_jobs`)."""
    if llm_format(model_format):
        _add_llm_edge_jobs(result, request, model_format, common)
        return
    engines = edge_engines(request.engines, model_format)
    for profile in request.edge:
        if not engines:
            result.excluded.append({"edge_profile": profile.name,
                                    "reason": f"no in-process engine for {model_format} models"})
            continue
        for edge_engine in engines:
            for b in batches:
                result.jobs.append(JobSpec(
                    job_id=job_id_for(common["request_id"], "cpu", edge_engine, b, 1, profile.name), device="cpu",
                    engine=edge_engine, protocol=protocol_of(edge_engine, request.measurement.llm), batch_size=b,
                    edge_profile=profile, queue=EDGE_QUEUE,
                    load=load_level(request.measurement.mode, 1, request.measurement.rate),
                    measurement=request.measurement, **common))


def _add_llm_edge_jobs(result: Expansion, request: ProfileRequest, model_format: str, common: JobCommon) -> None:
    """An LLM model on edge boxes: one job per (edge profile x CPU LLM engine x knob set x load level), its
    server held to the profile's limits and driven by the OpenAI client like a serving job (the worker's runner:
    ``workers.runners.llm_edge``); a profile with no CPU engine for the model's format is excluded."""
    engines = [e for e in request_engines(request, model_format) if is_openai(e)
               and incompatibility(e, model_format, "cpu") is None]
    for profile in request.edge:
        if not engines:
            result.excluded.append({"edge_profile": profile.name, "reason": f"no CPU LLM engine serves {model_format} "
                                    "models on an edge box (llama.cpp serves .gguf, transformers a Hugging Face "
                                    "folder)"})
            continue
        for engine, knobs in ((e, k) for e in engines for k in request.knob_configs()):
            variants = _cache_variants(request, engine)
            for (c, rate), (state, llm) in ((lv, v) for lv in _levels(request) for v in variants):
                m = request.measurement.model_copy(update={"rate": rate, "llm": llm})
                job_id = job_id_for(common["request_id"], "cpu", engine, 1, c, profile.name,
                                    {**PLAIN_SERVING, "rate": rate, "prefix_cache": state}, knobs)
                result.jobs.append(JobSpec(job_id=job_id, device="cpu", engine=engine,
                                           protocol=protocol_of(engine, m.llm), batch_size=1,
                                           load=load_level(m.mode, c, rate), edge_profile=profile, queue=EDGE_QUEUE,
                                           measurement=m, knobs=knobs, **common))


def _levels(request: ProfileRequest) -> list[tuple[int, float | None]]:
    """The (concurrency, open-loop rate) steps submitted upfront: all of them, or a quick search's first one
    (of the concurrency list, or in open loop of the rates at the request's one concurrency)."""
    rates = request.rate_levels()
    start = request.measurement.rate
    if request.measurement.search == "max-goodput" and start is not None:  # its first step (scheduler.goodput_rules)
        return [(request.concurrency[0], round_rate(start))]
    if request.measurement.search == "quick":
        first = first_level(request.search_levels(), request.measurement.p99_ms)
        if request.search_load() == "rate":
            return [(request.concurrency[0], float(first))]
        return [(int(first), rates[0])]
    return [(c, r) for c in request.concurrency for r in rates]


def _step_time(request: ProfileRequest, rate: float | None) -> dict[str, float | None]:
    """A max-goodput search's first step measures long enough for its rate (``goodput_rules.step_duration``)."""
    m = request.measurement
    if m.search != "max-goodput" or rate is None:
        return {}
    return {"duration_s": step_duration(m.duration_s, m.max_windows * m.window_s, rate)}


def edge_engines(engines: list[str], model_format: str) -> list[str]:
    """The engines edge runs use: the request's in-process engines that load ``model_format`` on a CPU
    (``--engine openvino``), else the format's default in-process engine (none for an endpoint)."""
    chosen = [e for e in engines if e in IN_PROCESS and incompatibility(e, model_format, "cpu") is None]
    default = FORMAT_ENGINE.get(model_format)
    return chosen or ([default] if default else [])


def job_count(request: ProfileRequest, model: ModelRef, gpu_products: list[str] | None = None) -> int:
    """How many jobs ``expand`` builds for ``request``, from its dimensions' lengths: the product is computed,
    nothing is allocated, so a matrix of millions of jobs is refused against ``FARM_JOB_LIMIT`` at once
    (expanding it first took gigabytes)."""
    devices, _ = resolve_devices(request.devices, gpu_products)
    batches = sum(1 for b in request.batch_sizes if model.static_batch in (None, b))
    pairs = sum(1 for d in devices for e in request_engines(request, model.format)
                if not incompatibility(e, model.format, d))
    m = request.measurement
    configs = len(request.instances or [m.instances]) * len(request.threads or [m.threads]) * len(
        request.max_queue_delay_us or [m.max_queue_delay_us])  # as ProfileRequest.serving_configs
    levels = 1 if m.search != "brute" else len(request.concurrency) * len(request.rate_levels())  # as _levels
    configs *= len(request.knob_configs()) * cache_states(request)
    edge = len(request.edge) * len(edge_engines(request.engines, model.format)) * batches  # as _add_edge_jobs
    if llm_format(model.format):  # as _add_llm_edge_jobs
        cpu = sum(1 for e in request_engines(request, model.format)
                  if is_openai(e) and incompatibility(e, model.format, "cpu") is None)
        edge = len(request.edge) * cpu * len(request.knob_configs()) * levels * cache_states(request)
    return pairs * batches * configs * levels + edge


def matrix_size(request: ProfileRequest, n_devices: int | None = None) -> int:
    """Upper bound of the job count before compatibility filtering (for the job limit), repeats included."""
    devices = n_devices if n_devices is not None else len(request.devices)
    cells = (devices * len(request.engines) * len(request.batch_sizes) * len(request.concurrency)
             * len(request.serving_configs()) * len(request.rate_levels())
             + len(request.edge) * len(request.batch_sizes) * max(1, sum(e in IN_PROCESS for e in request.engines)))
    return request.repeats * cells

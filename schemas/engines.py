"""The engine/format rules: which engine serves which model format on which device class, and which
engines load models in-process (edge runs, the built-in server), the default one per format."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRule:
    """An engine's formats and device classes (``cpu``, ``gpu``); ``in_process``: it loads models in farm's own
    processes (the built-in server, edge runs), through a backend of ``workers.engines.backends``."""

    formats: frozenset[str]
    devices: frozenset[str]
    in_process: bool = False


RULES: dict[str, EngineRule] = {
    "onnxruntime": EngineRule(frozenset({"onnx"}), frozenset({"cpu", "gpu"}), in_process=True),
    "torchscript": EngineRule(frozenset({"torchscript"}), frozenset({"cpu", "gpu"}), in_process=True),
    "triton": EngineRule(frozenset({"onnx", "torchscript"}), frozenset({"cpu", "gpu"})),
    # x86 CPUs: edge boxes and servers
    "openvino": EngineRule(frozenset({"onnx"}), frozenset({"cpu"}), in_process=True),
    # a running KServe v2 server farm only drives: its "model" is the endpoint's descriptor, and the
    # job's device is where the load generator runs
    "endpoint": EngineRule(frozenset({"endpoint"}), frozenset({"cpu"})),
    # LLM engines with their own OpenAI-compatible server (workers/serving/llama_cpp.py, transformers_serve.py,
    # vllm.py); their knobs: schemas.llm_engines
    "llama.cpp": EngineRule(frozenset({"gguf"}), frozenset({"cpu"})),
    "transformers": EngineRule(frozenset({"hf"}), frozenset({"cpu", "gpu"})),
    "vllm": EngineRule(frozenset({"hf"}), frozenset({"gpu"})),
}

#: the engine of ``farm submit --endpoint`` requests (set by the request, never chosen with --engine)
ENDPOINT_ENGINE = "endpoint"

#: the engine that loads each model format in-process by default: edge runs, farm's built-in server,
#: ``farm serve``
FORMAT_ENGINE: dict[str, str] = {"onnx": "onnxruntime", "torchscript": "torchscript"}
#: the engines that run in-process (farm's built-in server and edge runs), each for its RULES formats
IN_PROCESS: tuple[str, ...] = tuple(e for e, rule in RULES.items() if rule.in_process)
#: the name under which every server farm starts (the built-in one, Triton) serves the job's model
SERVED_MODEL_NAME = "model"

MODEL_FORMATS: tuple[str, ...] = tuple(FORMAT_ENGINE)
#: LLM model formats and the engine that serves each by default: a GGUF file (llama.cpp), a Hugging Face
#: model folder (config.json, weights, tokenizer: transformers)
LLM_FORMAT_ENGINE: dict[str, str] = {"gguf": "llama.cpp", "hf": "transformers"}
#: formats whose model is a folder: stored as one deterministic tar (``farm.artifacts``), unpacked on workers
FOLDER_FORMATS: frozenset[str] = frozenset({"hf"})
#: the engines that serve the OpenAI HTTP API (chat and completions, streamed) rather than KServe v2
OPENAI_ENGINES: tuple[str, ...] = ("llama.cpp", "transformers", "vllm")
#: the engines a request may name with --engine
ENGINES: tuple[str, ...] = tuple(e for e in RULES if e != ENDPOINT_ENGINE)


def incompatibility(engine: str, model_format: str, device: str) -> str | None:
    """Why ``engine`` cannot serve a ``model_format`` model on ``device``, or None when it can."""
    rule = RULES.get(engine)
    if rule is None:
        return f"unknown engine {engine!r}"
    if model_format not in rule.formats:
        return f"engine {engine} cannot load {model_format} models (it loads: {', '.join(sorted(rule.formats))})"
    device_class = device.split(":", 1)[0]
    if device_class not in rule.devices:
        return f"engine {engine} does not run on {device_class}"
    return None

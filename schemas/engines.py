"""The engine/format rules: which engine serves which model format on which device class, and which
engine loads each format in-process (edge runs, the built-in server)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRule:
    """An engine's formats and device classes (``cpu``, ``gpu``)."""

    formats: frozenset[str]
    devices: frozenset[str]


RULES: dict[str, EngineRule] = {
    "onnxruntime": EngineRule(frozenset({"onnx"}), frozenset({"cpu", "gpu"})),
    "torchscript": EngineRule(frozenset({"torchscript"}), frozenset({"cpu", "gpu"})),
    "triton": EngineRule(frozenset({"onnx", "torchscript"}), frozenset({"cpu", "gpu"})),
}

#: the engine that loads each model format in-process: edge runs, farm's built-in server, ``farm serve``
FORMAT_ENGINE: dict[str, str] = {"onnx": "onnxruntime", "torchscript": "torchscript"}

MODEL_FORMATS: tuple[str, ...] = tuple(FORMAT_ENGINE)
ENGINES: tuple[str, ...] = tuple(RULES)


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

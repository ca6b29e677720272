"""Static model metrics, like deeplite-profiler: parameters, size, MACs, FLOPs, activation memory.

``analyze(path, format, inputs)`` returns a dict, all figures per sample (counted at batch 1, or at the
model's fixed batch size divided by it when its batch dimension is static):

- ``params``: parameter count (ONNX: elements of all graph initializers; TorchScript: ``parameters()``)
- ``param_bytes``: bytes of those parameters; ``size_bytes``: the model file's size
- ``macs_per_sample``: multiply-accumulates (Conv, ConvTranspose, Gemm, MatMul, attention,
  BatchNormalization); None unless every op was counted
- ``flops_per_sample``: 2 * MACs + bias adds + elementwise/pool/reduce/softmax/normalization FLOPs
  (rules in ``farm.models.onnx_counter``; the TorchScript counter follows the same rules on aten ops);
  None unless every op was counted
- ``macs_at_least`` / ``flops_at_least``: when some ops could not be counted, the counted part (a lower
  bound; shown as ``>= N (missing: OP xK, ...)`` by ``headline``), else None
- ``activation_bytes_per_sample``: SUM of all intermediate tensor sizes (node outputs, graph outputs
  included, graph inputs and weights excluded) = the memory needed with no buffer reuse (None when a
  size is unknown, as is the peak)
- ``activation_peak_bytes_per_sample``: PEAK of live tensors (graph inputs included) when each tensor
  is freed after its last consumer, in graph order (ONNX only; None for TorchScript)
- ``ops``: ``{op_type: {"count", "macs", "flops"}}`` (macs/flops None when unknown)
- ``dtype``: KServe datatype holding most parameter bytes, INT32/INT64 (shape and index tensors)
  ignored; the first input's dtype when there are no such parameters
- ``complete``: False when some node's cost or size is unknown; ``unknown_ops``: ``{op_type: count}``
- ``attention_subgraphs``: attention blocks found (ONNX: Softmax between two MatMuls; TorchScript: calls of
  scaled_dot_product_attention, None when there are none, as written-out attention is not matched there)
- ``format``, ``sha256``, ``inputs`` (``name:DTYPE:shape`` strings), ``notes`` (one-line strings)

Unknown figures are None, never 0.
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from farm.errors import ModelError
from farm.models.info import detect_format, format_input_spec, inspect_model_full
from farm.models.onnx_counter import analyze_onnx_model
from farm.models.torch_counter import analyze_torchscript
from farm.models.torchscript import PROBE_MODULE, probe_args
from farm.sandbox import model_jail, run_jailed
from schemas import TensorSpec

__all__ = ["analyze", "headline"]


def analyze(path: Path, format: str | None = None, inputs: list[TensorSpec] | None = None) -> dict[str, Any]:
    """Static metrics of the model at ``path`` for per-sample ``inputs`` (inferred when None). A model whose
    loading runs code is checked and counted in one jailed run (``farm.sandbox``)."""
    path = Path(path)
    fmt = detect_format(path) if zipfile.is_zipfile(path) else None  # a zip: cheap to tell; TorchScript is one
    if fmt is not None and format in (None, fmt) and model_jail(fmt, path.name):
        return run_jailed(PROBE_MODULE, probe_args("report", path, inputs), read_only=[path],
                          what=f"the analysis of {path.name}")
    return analyze_here(path, format, inputs)


def analyze_here(path: Path, format: str | None = None, inputs: list[TensorSpec] | None = None) -> dict[str, Any]:
    """:func:`analyze` in this process (the jail's side, or a trusted model's)."""
    path = Path(path)
    info, model = inspect_model_full(path, format, inputs)  # validates file and inputs, else ModelError
    if info.format == "onnx":
        out = analyze_onnx_model(model, info.inputs, batch=info.static_batch or 1)
    elif info.format == "torchscript":
        out = analyze_torchscript(path, info.inputs)
    else:  # pragma: no cover - inspect_model only returns known formats
        raise ModelError(f"cannot analyze format {info.format!r}")
    notes = list(info.notes)
    if out.get("attention_subgraphs"):
        notes.append(f"{out['attention_subgraphs']} attention blocks (Q K^T, softmax, P V), counted in the totals")
    if out["unknown_ops"]:
        notes.append("cost unknown for " + ", ".join(f"{k} x{v}" for k, v in out["unknown_ops"].items())
                     + "; the MAC and FLOP totals are lower bounds")
    return {"format": info.format, "sha256": info.sha256, "size_bytes": info.size_bytes,
            "inputs": [format_input_spec(s) for s in info.inputs], **out, "notes": notes}


def headline(report: dict[str, Any], name: str) -> str:
    """A static metric for humans: ``1,234`` when exact, ``>= 1,234 (missing: Erf x2)`` for a lower
    bound (``macs_per_sample`` and ``flops_per_sample``), ``unknown`` otherwise."""
    value = report.get(name)
    if value is not None:
        return f"{value:,}"
    bound = report.get(name.replace("_per_sample", "_at_least")) if name.endswith("_per_sample") else None
    if bound is None:
        return "unknown"
    missing = ", ".join(f"{op} x{n}" for op, n in (report.get("unknown_ops") or {}).items())
    return f">= {bound:,} (missing: {missing or 'some operators'})"

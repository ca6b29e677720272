"""Static meets measured: a model's per-node static costs (``farm analyze --layers``) and a job's op profile,
joined by node name (``farm.op_profile.join_layers``), with the model's total against the device's peak
(``farm.peaks``), for ``farm ops JOB`` and ``farm analyze MODEL --layers --job JOB``.

- ONNX: ``farm.models.onnx_counter.node_costs`` on the graph (parsing runs no model code).
- TorchScript: ``farm.models.torch_layers`` (loading runs the file's code: in the sandbox, as ``farm analyze``).
- Other formats have no per-node static view: :func:`static_layers` says so (``RequestError``).
"""
from __future__ import annotations

from pathlib import Path

from farm.artifacts import fetch_model
from farm.errors import RequestError
from farm.op_profile import Stored, achieved, join_layers
from schemas import TensorSpec
from schemas.op_profile import LayerCost, LayersView, OpProfile

LAYER_FORMATS = ("onnx", "torchscript")


def static_layers(model: Path, model_format: str, inputs: list[TensorSpec], batch: int) -> list[LayerCost]:
    """Per-node static costs of one call at ``batch`` under the names the format's engine profile reports."""
    if model_format == "onnx":
        import onnx  # noqa: PLC0415 - heavy, and only the layer-wise view needs the graph itself

        from farm.models.onnx_counter import node_costs  # noqa: PLC0415 - imports onnx helpers

        return node_costs(onnx.load(str(model)), inputs, batch=batch)
    if model_format == "torchscript":
        from farm.models.torch_layers import torchscript_layers  # noqa: PLC0415 - torch side, jailed

        return torchscript_layers(model, inputs, batch)
    raise RequestError(f"per-node static costs cover {' and '.join(LAYER_FORMATS)} models; "
                           f"{model.name} is {model_format}: read `farm ops JOB` without them")


def joined(layers: list[LayerCost], prof: OpProfile, peak_gflops: float | None) -> LayersView:
    """The join and the total: ``{"layers": [...], "total": {...}}`` (``peak_gflops``: the user's, else the
    profile's own measured or datasheet peak)."""
    return LayersView(layers=join_layers(layers, prof), total=achieved(layers, prof, peak_gflops))


def job_layers(stored: Stored, peak_gflops: float | None) -> LayersView:
    """:func:`joined` for a stored profile, the model taken from the artifact store at the profile's batch."""
    job = stored.job
    fmt = str(job.get("model_format") or "")
    if fmt not in LAYER_FORMATS:
        raise RequestError(f"no per-node static costs for a {fmt or 'model of unknown format'}")
    model = fetch_model(str(job["model_sha256"]), str(job.get("model_filename") or "model"))
    inputs = [TensorSpec.model_validate(t) for t in job.get("inputs") or []]
    return joined(static_layers(model, fmt, inputs, stored.profile.batch_size), stored.profile, peak_gflops)

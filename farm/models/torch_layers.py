"""The layer-wise static view of a TorchScript model (``farm analyze MODEL --layers``): per node MACs/FLOPs,
parameters and output bytes, under the names the op-profiling pass gives the same nodes
(``farm.models.torch_nodes``), so that a job's op profile joins them (``farm.op_profile.join_layers``).

How: the module runs at the given batch, as the pass runs it (farm's TorchScript backend: inputs from numpy, the
call under ``torch.inference_mode``, outputs detached back to numpy; after a warm-up that lets TorchScript's
profiling executor settle on its optimized graph), once under ``torch.profiler`` (the call
tree, hence the names) and once under the TorchScript MAC counter (``farm.models.torch_counter``: its rules, one
table for ``farm analyze`` and this view). The counter sees the ops that reach the dispatcher's Python key, in
call order; composite ops (``aten::linear``) reach it only as their parts (``aten::t``, ``aten::addmm``).
Walking the profiler's tree in call order, the next counted op's first event takes its cost; the events below
it (its kernels: ``aten::convolution`` -> ``aten::mkldnn_convolution``) are its own: ``covers_subtree`` says
their time belongs to it. A composite event keeps 0 (its cost is in its parts); an event the counter never saw
and with no parts has no cost (None): never a guess.

Loading a TorchScript file runs its code: this runs in the sandbox unless the operator trusts this host's
models (``farm.sandbox``), like ``farm analyze`` of the same file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from farm.errors import ModelError
from farm.models.spec import one_line
from farm.models.torch_counter import FREE, counting_mode
from farm.models.torch_nodes import TORCH_MARK, torch_nodes
from farm.models.torchscript import PROBE_MODULE, load_torchscript, probe_args, require_torch, torch_inputs
from farm.sandbox import model_jail, run_jailed
from schemas import TensorSpec
from schemas.op_profile import LayerCost

#: inferences before the named and counted ones (the op-profiling pass warms up with 5)
WARMUP = 3
#: the most free counted calls skipped to find an event's match (``_next_match``)
LOOKAHEAD = 4


def torchscript_layers(path: Path, inputs: list[TensorSpec], batch: int = 1) -> list[LayerCost]:
    """:func:`torchscript_layers_here`, in the sandbox unless the operator trusts this host's models."""
    if model_jail("torchscript", Path(path).name):
        got = run_jailed(PROBE_MODULE, [*probe_args("layers", path, inputs), str(batch)], read_only=[path],
                         what=f"the layer-wise analysis of {Path(path).name}")
        return list(got["layers"])
    return torchscript_layers_here(path, inputs, batch)


def torchscript_layers_here(path: Path, inputs: list[TensorSpec], batch: int = 1) -> list[LayerCost]:
    """Per node of one batch call (not per sample): ``name`` (the profile's), ``op_type`` (``aten::…``),
    ``macs`` and ``flops`` (None: no rule), ``params`` and ``param_bytes`` (parameters among its inputs, for an
    op that computes), ``activation_bytes`` (newly allocated outputs) and ``covers_subtree``."""
    torch = require_torch()
    module = load_torchscript(path)
    arrays = [t.numpy() for t in torch_inputs(inputs, batch=batch)]
    params = {p.untyped_storage().data_ptr(): (p.numel(), p.numel() * p.element_size())
              for p in module.parameters()}

    def call(inference: bool) -> None:
        """One inference as farm's TorchScript backend serves it (its conversions are profiled nodes too)."""
        args = [torch.from_numpy(a) for a in arrays]
        with torch.inference_mode(inference):
            out = module(*args)
        for t in out if isinstance(out, (tuple, list)) else out.values() if isinstance(out, dict) else [out]:
            t.detach().cpu().numpy()

    counter = counting_mode()
    try:
        for _ in range(WARMUP):
            call(True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with torch.profiler.record_function(TORCH_MARK):
                call(True)
        with torch.no_grad(), counter:  # as farm analyze counts: composite ops reach the counter as their parts
            call(False)
    except Exception as exc:
        raise ModelError(f"{Path(path).name} failed on a batch of {batch} while counting its layers: "
                         f"{one_line(exc, 160)}; check the --input shapes") from None
    marks = [e for e in prof.events() if e.name == TORCH_MARK]
    if not marks:
        raise ModelError(f"torch.profiler recorded no call of {Path(path).name}; run farm analyze without --layers")
    return _align(torch_nodes(marks[0]), counter.calls, params)


def _align(events: list[tuple[str, Any]], calls: list[tuple[str, Any, int, set[int]]],
           params: dict[int, tuple[int, int]]) -> list[LayerCost]:
    """The profiler's events (pre-order, named) with the counter's calls (in call order) laid onto them."""
    rows: list[LayerCost] = []
    i, inside = 0, None
    for name, evt in events:
        if inside is not None and name.startswith(inside):
            continue  # a kernel of the counted op above it: its time is that op's
        inside = None
        op = evt.name.removeprefix("aten::")
        row = LayerCost(name=name, op_type=evt.name, macs=None, flops=None, params=0, param_bytes=0,
                        activation_bytes=None, covers_subtree=False)
        j = _next_match(op, calls, i)
        if j is not None:
            _, cost, out_bytes, in_ptrs = calls[j]
            i, inside = j + 1, name + "/"
            weights = [params[p] for p in in_ptrs if p in params] if cost and cost[1] > 0 else []
            row.update(LayerCost(name=name, op_type=evt.name, macs=cost[0] if cost else None,
                                 flops=cost[1] if cost else None, params=sum(w[0] for w in weights),
                                 param_bytes=sum(w[1] for w in weights), activation_bytes=out_bytes,
                                 covers_subtree=True))
        elif evt.cpu_children or op in FREE:  # a composite: its cost is in its parts
            row["macs"], row["flops"], row["activation_bytes"] = 0, 0, 0
        rows.append(row)
    return rows


def _next_match(op: str, calls: list[tuple[str, Any, int, set[int]]], i: int) -> int | None:
    """The index of the counted call ``op`` takes: the next one, or one after a few free calls the profiler
    does not record where the counter sees them (``detach`` of an intermediate, outside inference mode);
    None: ``op`` is no counted call here (a composite, or a kernel the counter does not see)."""
    j = i
    while j < len(calls) and j <= i + LOOKAHEAD:
        if calls[j][0] == op:
            return j
        if calls[j][1] != (0, 0):  # a call that computes is never skipped
            return None
        j += 1
    return None


class LayersAnswer(TypedDict):
    """The jailed probe's answer to ``layers``: the per-node static costs."""

    layers: list[LayerCost]


def layers_json(path: Path, inputs: list[TensorSpec], batch: int) -> LayersAnswer:
    """The jailed probe's answer (``farm.models.probe layers``)."""
    return LayersAnswer(layers=torchscript_layers_here(path, inputs, batch))

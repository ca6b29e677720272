"""Static metrics of a TorchScript model: parameters from the module, MACs/FLOPs by running it once.

Attention counts both ways it reaches the dispatcher: ``scaled_dot_product_attention`` (and its kernels,
``SDPA``) by the ONNX Attention rule, written-out ``matmul``/``softmax``/``matmul`` op by op (as bmm).

The module runs on a batch of 1 (zeros of the input spec) under a ``TorchDispatchMode`` that sees every
aten op the TorchScript interpreter executes and applies the ONNX counter's rules to it (see
``farm.models.onnx_counter``). Ops outside the table are reported as unknown, never counted as 0.
Shape, indexing and creation ops (``FREE``: ``new_ones``, ``scalar_tensor``, ``index``, ...) cost 0; mask
arithmetic (``bitwise_and``, ``masked_fill``, ``rsub``, ...) 0 MACs and 1 FLOP per element, as ONNX And/Where;
ops returning a Python scalar (``_local_scalar_dense``, ``equal``) are counted by their inputs. So a traced
Hugging Face encoder's attention-mask code leaves its totals complete.
Activation bytes are the sum of newly allocated op outputs (views excluded); the peak is not tracked.
"""
from __future__ import annotations

from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any

from farm.errors import ModelError
from farm.models.onnx_counter import totals
from farm.models.spec import one_line
from farm.models.torchscript import PROBE_MODULE, load_torchscript, probe_args, require_torch, torch_inputs
from farm.sandbox import model_jail, run_jailed
from schemas import TensorSpec
from schemas.dtypes import TORCH_TO_V2

Cost = tuple[int, int]  # (MACs, FLOPs)

ELEMENTWISE = frozenset({
    "relu", "relu_", "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "sigmoid", "tanh", "exp",
    "log", "gelu", "silu", "clamp", "clamp_min", "clamp_max", "hardtanh", "hardtanh_", "hardswish",
    "hardsigmoid", "leaky_relu", "elu", "pow", "neg", "abs", "sqrt", "rsqrt", "reciprocal", "maximum",
    "minimum", "where", "eq", "ne", "gt", "ge", "lt", "le", "logical_and", "logical_or", "logical_not",
    "sin", "cos", "erf", "floor", "ceil", "round", "sign", "softplus", "mish", "prelu", "_prelu_kernel",
    # masks (ONNX And/Or/Xor/Not, Where, Sub, Mod): what attention-mask code runs
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_xor", "masked_fill", "masked_fill_",
    "rsub", "remainder", "fmod", "floor_divide", "isnan", "isinf", "eq_", "ne_",
})
FREE = frozenset({
    "view", "t", "reshape", "_unsafe_view", "permute", "transpose", "expand", "flatten", "squeeze",
    "unsqueeze", "clone", "contiguous", "detach", "cat", "slice", "select", "index_select", "alias",
    "as_strided", "_to_copy", "to", "copy_", "empty", "zeros", "ones", "full", "lift_fresh", "split",
    "split_with_sizes", "chunk", "stack", "unbind", "dropout", "embedding", "_reshape_alias", "narrow",
    "zeros_like", "ones_like", "empty_like", "fill_", "zero_", "constant_pad_nd", "pad", "repeat",
    "gather", "index", "arange", "_local_scalar_dense", "item", "numpy_T", "unflatten", "new_zeros",
    # creation (ONNX Constant/ConstantOfShape/EyeLike/Range/Trilu/OneHot), shape and indexing (Scatter*)
    "scalar_tensor", "new_ones", "new_full", "new_empty", "new_empty_strided", "full_like", "empty_strided",
    "lift_fresh_copy", "linspace", "eye", "tril", "triu", "one_hot", "index_put", "index_put_", "scatter",
    "scatter_", "slice_scatter", "select_scatter", "expand_as", "view_as", "broadcast_to", "movedim",
    "squeeze_", "unsqueeze_", "type_as", "resolve_conj", "resolve_neg", "detach_", "masked_select",
    "is_nonzero", "_assert_async", "_assert_tensor_metadata", "sym_constrain_range_for_size",
})
REDUCE = frozenset({
    "mean", "sum", "amax", "amin", "max", "min", "argmax", "argmin", "all", "any", "equal", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d", "prod", "norm", "var", "std",
})
POOL = frozenset({
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "avg_pool1d", "avg_pool2d", "avg_pool3d",
})

#: scaled dot product attention, as called and as dispatched to its CPU/GPU kernels.
SDPA = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math_for_mps",
    "_scaled_dot_product_fused_attention_overrideable",
})


def _numel(x: Any) -> int:
    return int(x.numel())


def _matmul(args: tuple[Any, ...], out: Any) -> Cost:
    a = args[0]
    macs = _numel(out) * int(a.shape[-1])
    return macs, 2 * macs


def _addmm(args: tuple[Any, ...], out: Any) -> Cost:  # addmm(bias, a, b), baddbmm(bias, a, b)
    macs = _numel(out) * int(args[1].shape[-1])
    return macs, 2 * macs + _numel(out)


def _linear(args: tuple[Any, ...], out: Any) -> Cost:  # linear(x, w, bias=None)
    macs = _numel(out) * int(args[1].shape[-1])
    bias = len(args) > 2 and args[2] is not None
    return macs, 2 * macs + (_numel(out) if bias else 0)


def _conv(args: tuple[Any, ...], out: Any) -> Cost:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    x, w = args[0], args[1]
    transposed = bool(args[6]) if len(args) > 6 else False
    macs = (_numel(x) if transposed else _numel(out)) * prod(int(d) for d in w.shape[1:])
    bias = len(args) > 2 and args[2] is not None
    return macs, 2 * macs + (_numel(out) if bias else 0)


def _sdpa(args: tuple[Any, ...], out: Any) -> Cost:
    """scaled_dot_product_attention(query [.., L, E], key [.., S, E], value [.., S, Ev], ...) -> [.., L, Ev]:
    Q K^T and P V; FLOPs add 4 per score (scale and softmax), as the ONNX counter's Attention rule."""
    q, k = args[0], args[1]
    s = int(k.shape[-2])
    macs = s * (_numel(q) + _numel(out))
    return macs, 2 * macs + 4 * (_numel(q) // int(q.shape[-1])) * s


def _batchnorm(args: tuple[Any, ...], out: Any) -> Cost:
    e = _numel(args[0])
    return e, 2 * e


def _pool(args: tuple[Any, ...], out: Any) -> Cost:
    x, kernel = args[0], list(args[1])
    spatial = max(1, x.dim() - 2)
    k = prod(kernel) if len(kernel) == spatial else kernel[0] ** spatial
    return 0, _numel(out) * k


HANDLERS: dict[str, Callable[[tuple[Any, ...], Any], Cost]] = {
    "mm": _matmul, "bmm": _matmul, "matmul": _matmul, "addmm": _addmm, "baddbmm": _addmm,
    "linear": _linear, "convolution": _conv, "_convolution": _conv,
    "native_batch_norm": _batchnorm, "_native_batch_norm_legit_no_training": _batchnorm,
    "batch_norm": _batchnorm,
    **{op: _sdpa for op in SDPA},
    **{op: _pool for op in POOL},
    **{op: (lambda a, o: (0, _numel(o))) for op in ELEMENTWISE},
    **{op: (lambda a, o: (0, 0)) for op in FREE},
    **{op: (lambda a, o: (0, _numel(a[0]))) for op in REDUCE},
    "_softmax": lambda a, o: (0, 3 * _numel(o)), "softmax": lambda a, o: (0, 3 * _numel(o)),
    "_safe_softmax": lambda a, o: (0, 3 * _numel(o)),
    "_log_softmax": lambda a, o: (0, 3 * _numel(o)), "native_layer_norm": lambda a, o: (0, 5 * _numel(o)),
    "layer_norm": lambda a, o: (0, 5 * _numel(o)), "native_group_norm": lambda a, o: (0, 5 * _numel(o)),
    "_fused_rms_norm": lambda a, o: (0, 4 * _numel(o)),
}


def counting_mode() -> Any:
    """A ``TorchDispatchMode`` that counts every aten op run inside it by ``HANDLERS`` (``farm analyze``, and
    ``farm.models.torch_layers`` per node: ``calls`` keeps each call in order)."""
    torch = require_torch()
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415 - torch is an optional extra (farm[torch])

    class Counter(TorchDispatchMode):
        """Applies HANDLERS to every aten op; sums MACs, FLOPs and new output bytes."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: dict[str, dict[str, Any]] = {}
            self.unknown: dict[str, int] = {}
            self.macs = self.flops = self.act_bytes = 0
            #: every call in order: (op name, its cost or None, new output bytes, the storages of its inputs)
            self.calls: list[tuple[str, Cost | None, int, set[int]]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            entry = self.ops.setdefault(name, {"count": 0, "macs": 0, "flops": 0})
            entry["count"] += 1
            handler = HANDLERS.get(name)
            cost = None
            if handler is not None:  # ``first`` may be a Python scalar (item, equal): a rule needing a tensor fails
                try:
                    cost = handler(tuple(args), first)
                except (IndexError, TypeError, AttributeError, ValueError):
                    cost = None
            if cost is None:
                self.unknown[name] = self.unknown.get(name, 0) + 1
                entry["macs"] = entry["flops"] = None
            else:
                self.macs += cost[0]
                self.flops += cost[1]
                if entry["macs"] is not None:
                    entry["macs"] += cost[0]
                    entry["flops"] += cost[1]
            in_ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            new_bytes = 0
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in in_ptrs:
                    new_bytes += _numel(t) * t.element_size()
            self.act_bytes += new_bytes
            self.calls.append((name, cost, new_bytes, in_ptrs))
            return out

    return Counter()


def analyze_torchscript(path: Path, inputs: list[TensorSpec]) -> dict[str, Any]:
    """:func:`analyze_torchscript_here`, in the sandbox unless the operator trusts this host's models."""
    if model_jail("torchscript", Path(path).name):
        return run_jailed(PROBE_MODULE, probe_args("analyze", path, inputs), read_only=[path],
                          what=f"the analysis of {Path(path).name}")
    return analyze_torchscript_here(path, inputs)


def analyze_torchscript_here(path: Path, inputs: list[TensorSpec]) -> dict[str, Any]:
    """Static metrics of a TorchScript file for per-sample ``inputs`` (see ``farm.models.analysis``)."""
    torch = require_torch()
    module = load_torchscript(path)
    params = list(module.parameters())
    by_dtype: dict[str, int] = {}
    for p in params:
        key = str(p.dtype).replace("torch.", "")
        by_dtype[key] = by_dtype.get(key, 0) + p.numel() * p.element_size()
    dominant = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else None
    dtype = TORCH_TO_V2.get(dominant or "") or (inputs[0].dtype if inputs else None)
    tensors = torch_inputs(inputs, batch=1)
    counter = counting_mode()
    try:
        with torch.no_grad(), counter:
            module(*tensors)
    except Exception as exc:
        raise ModelError(f"{Path(path).name} failed on a batch of 1 while counting operations: "
                         f"{one_line(exc, 160)}; check the --input shapes") from None
    known = any(v["macs"] is not None for v in counter.ops.values())
    return {
        "params": sum(p.numel() for p in params),
        "param_bytes": sum(by_dtype.values()),
        **totals(counter.macs, counter.flops, counter.unknown, known),
        "activation_bytes_per_sample": counter.act_bytes,
        "activation_peak_bytes_per_sample": None,
        "ops": dict(sorted(counter.ops.items())),
        "dtype": dtype,
        "complete": not counter.unknown,
        "unknown_ops": counter.unknown,
        "attention_subgraphs": sum(v["count"] for k, v in counter.ops.items() if k in SDPA) or None,
    }

"""Static cost of an ONNX graph at batch 1: MACs, FLOPs and activation bytes per node.

Counting rules (per sample: shapes inferred with the batch dimension fixed to 1, or to a static model's
fixed batch size with every count divided by it):

- Conv: MACs = out elements * (C_in/groups) * prod(kernel) (= out elements * prod(W.shape[1:]));
  dilations and strides enter through the output shape. FLOPs = 2*MACs + out elements if there is a bias.
- ConvTranspose: MACs = in elements * (C_out/groups) * prod(kernel); bias as Conv.
- Gemm: MACs = M*K*N; FLOPs = 2*MACs + M*N when C is given (alpha/beta scaling not counted).
- MatMul (broadcast batch dims, 1-D operands): MACs = out elements * K; FLOPs = 2*MACs.
- BatchNormalization (inference, folded to x*a+b): MACs = elements, FLOPs = 2*elements.
- Elementwise unary/binary ops (Relu, Add, Mul, Sigmoid, ...): 0 MACs, 1 FLOP per output element
  (variadic Sum/Max/Min/Mean: inputs-1 per output element).
- Attention (opset 23; com.microsoft MultiHeadAttention): MACs = S * (Q elements + output elements)
  (Q K^T and P V; S = key length), FLOPs = 2*MACs + 4 per score (scale and softmax); com.microsoft
  Attention (packed QKV weights) adds its input projection (input elements * packed width) and bias. Attention written
  out as MatMul/Mul/Softmax/MatMul (what exporters emit) is counted op by op with the same result.
- MaxPool/AveragePool/LpPool: out elements * prod(kernel) FLOPs; global pools and Reduce*/ArgMax:
  in elements FLOPs; Softmax/LogSoftmax: 3 FLOPs per element; normalization per element: ``NORM``
  (LayerNormalization 5; decomposed LayerNorm counts its ReduceMean/Sub/Pow/Add/Sqrt/Div/Mul ops).
- Shape-only and data-movement ops (Flatten, Reshape, Transpose, Concat, Gather, Expand, ...): 0.
- Any other op, or a node whose shapes inference could not resolve: unknown (None), listed and the
  totals flagged ``complete: False`` (never counted as 0).

Shapes: the graph inputs get the given concrete shapes, the exporter's (symbolic) intermediate shapes
are dropped, and ONNX shape inference with data propagation runs through the graph; where it leaves a
node output unresolved (e.g. Reshape to a shape computed from ``Shape``), ONNX Runtime's symbolic shape
inference fills in the rest.
"""
from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any

from farm.models.info import ONNX_TO_KSERVE, fix_input_shapes, infer_onnx_shapes, onnx_graph_inputs
from farm.models.spec import onnx_modules
from schemas import TensorSpec
from schemas.op_profile import LayerCost

Shape = list[int]
# ONNX elem_type -> bytes per element (FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, BOOL, FLOAT16,
# DOUBLE, UINT32, UINT64, BFLOAT16).
ITEMSIZE: dict[int, int] = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}

UNARY = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs",
    "Erf", "Clip", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "Softplus", "Softsign", "Sin", "Cos",
    "Floor", "Ceil", "Round", "Not", "Sign", "Gelu", "Mish", "ThresholdedRelu", "IsNaN", "IsInf",
    "QuantizeLinear", "DequantizeLinear", "Swish", "FastGelu", "QuickGelu", "BiasGelu", "CumSum", "Shrink",
    "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "BitwiseNot",
})
BINARY = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual",
    "And", "Or", "Xor", "Where", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
})
VARIADIC = frozenset({"Sum", "Max", "Min", "Mean"})
FREE = frozenset({
    "Flatten", "Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Shape", "Size",
    "Gather", "GatherElements", "GatherND", "Expand", "Constant", "ConstantOfShape", "Cast", "CastLike",
    "Slice", "Split", "Tile", "Pad", "Dropout", "Range", "DepthToSpace", "SpaceToDepth", "ScatterND",
    "ScatterElements", "OneHot", "EyeLike", "Trilu",
})
REDUCE = frozenset({
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "GlobalAveragePool",
    "GlobalMaxPool", "GlobalLpPool",
})
POOL = frozenset({"MaxPool", "AveragePool", "LpPool"})
#: FLOPs per output element of normalization ops (mean, centre, variance, rsqrt, scale and shift).
NORM: dict[str, int] = {
    "LayerNormalization": 5, "InstanceNormalization": 5, "GroupNormalization": 5, "MeanVarianceNormalization": 4,
    "SimplifiedLayerNormalization": 4, "RMSNormalization": 4, "SkipLayerNormalization": 6,
    "SkipSimplifiedLayerNormalization": 5, "LpNormalization": 3,
}


class _Node:
    """A node with its input/output shapes (None when unknown; '' inputs are absent)."""

    def __init__(self, node: Any, shapes: dict[str, Shape | None]) -> None:
        self.op = node.op_type
        self.node = node
        self.present = [n != "" for n in node.input]
        self.ins = [shapes.get(n) if n else None for n in node.input]
        self.outs = [shapes.get(n) for n in node.output]

    def attr(self, name: str, default: Any = None) -> Any:
        _, helper, _ = onnx_modules()
        for a in self.node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def has_input(self, i: int) -> bool:
        return len(self.present) > i and self.present[i]


Cost = tuple[int, int]  # (MACs, FLOPs)


class _Unknown(Exception):
    """A shape the inference could not resolve."""


def _n(shape: Shape | None) -> int:
    if shape is None:
        raise _Unknown
    return prod(shape)


def _dims(shape: Shape | None) -> Shape:
    if shape is None:
        raise _Unknown
    return shape


def _conv(n: _Node, w: int = 1, bias: int = 2) -> Cost:
    macs = _n(n.outs[0]) * prod(_dims(n.ins[w])[1:])
    return macs, 2 * macs + (_n(n.outs[0]) if n.has_input(bias) else 0)


def _conv_transpose(n: _Node) -> Cost:
    macs = _n(n.ins[0]) * prod(_dims(n.ins[1])[1:])
    return macs, 2 * macs + (_n(n.outs[0]) if n.has_input(2) else 0)


def _gemm(n: _Node) -> Cost:
    a = _dims(n.ins[0])
    k = a[0] if n.attr("transA", 0) else a[1]
    out = _n(n.outs[0])
    macs = out * k
    return macs, 2 * macs + (out if n.has_input(2) else 0)


def _matmul(n: _Node) -> Cost:
    macs = _n(n.outs[0]) * _dims(n.ins[0])[-1]  # out elements * K (a 1-D A is [K])
    return macs, 2 * macs


def _packed_attention(n: _Node) -> Cost:
    """com.microsoft Attention: input [B,S,D] times packed weights [D, Dq+Dk+Dv] (+ bias), then attention
    of S queries over S keys (no past state) in ``num_heads`` heads."""
    x, w = _dims(n.ins[0]), _dims(n.ins[1])
    if len(x) != 3 or len(w) != 2 or n.has_input(4) or n.has_input(6):  # past state / past key: not counted
        raise _Unknown
    dq, _, dv = n.attr("qkv_hidden_sizes", None) or [w[1] // 3] * 3
    b, s = x[0], x[1]
    proj = _n(x) * w[1]
    macs = proj + b * s * s * (dq + dv)
    return macs, 2 * macs + (b * s * w[1] if n.has_input(2) else 0) + 4 * b * int(n.attr("num_heads")) * s * s


def _attention(n: _Node) -> Cost:
    """ONNX Attention / com.microsoft MultiHeadAttention: Q [B,H,L,E] or [B,L,H*E], K [B,Hk,S,E] or [B,S,.]."""
    if n.node.domain == "com.microsoft" and n.op == "Attention":
        return _packed_attention(n)
    q, k = _dims(n.ins[0]), _dims(n.ins[1])
    if len(q) not in (3, 4) or len(k) not in (3, 4):
        raise _Unknown
    s = k[-2] if len(k) == 4 else k[1]
    head = q[-1] if len(q) == 4 else q[-1] // int(n.attr("q_num_heads", n.attr("num_heads", 0)) or 0)
    macs = s * (_n(q) + _n(n.outs[0]))
    return macs, 2 * macs + 4 * (_n(q) // head) * s


def _norm(n: _Node) -> Cost:
    return 0, NORM[n.op] * _n(n.outs[0])


def _batchnorm(n: _Node) -> Cost:
    e = _n(n.ins[0])
    return e, 2 * e


def _pool(n: _Node) -> Cost:
    return 0, _n(n.outs[0]) * prod(n.attr("kernel_shape", [1]))


def _variadic(n: _Node) -> Cost:
    return 0, _n(n.outs[0]) * max(1, len(n.ins) - 1)


HANDLERS: dict[str, Callable[[_Node], Cost]] = {
    "Conv": _conv, "ConvInteger": _conv, "ConvTranspose": _conv_transpose, "Gemm": _gemm,
    "MatMul": _matmul, "MatMulInteger": _matmul, "QLinearMatMul": _matmul,
    "QLinearConv": lambda n: _conv(n, w=3, bias=8), "BatchNormalization": _batchnorm,
    **{op: _pool for op in POOL}, **{op: _variadic for op in VARIADIC},
    **{op: (lambda n: (0, _n(n.outs[0]))) for op in UNARY | BINARY},
    **{op: (lambda n: (0, 0)) for op in FREE},
    **{op: (lambda n: (0, _n(n.ins[0]))) for op in REDUCE},
    "Softmax": lambda n: (0, 3 * _n(n.outs[0])), "LogSoftmax": lambda n: (0, 3 * _n(n.outs[0])),
    **{op: _norm for op in NORM},
    "Attention": _attention, "MultiHeadAttention": _attention,
}


def _shape_table(model: Any) -> tuple[dict[str, Shape | None], dict[str, int]]:
    """name -> concrete dims (None if any dim unknown) and name -> elem_type, for every value."""
    shapes: dict[str, Shape | None] = {}
    types: dict[str, int] = {}
    g = model.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        types[vi.name] = tt.elem_type
        if not tt.HasField("shape"):
            shapes[vi.name] = None
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        shapes[vi.name] = None if any(d < 0 for d in dims) else dims
    for init in g.initializer:
        shapes[init.name] = list(init.dims)
        types[init.name] = init.data_type
    for node in g.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.t is not None:
                    shapes[node.output[0]] = list(a.t.dims)
                    types[node.output[0]] = a.t.data_type
    return shapes, types


def _unresolved(model: Any, shapes: dict[str, Shape | None]) -> list[str]:
    """Node outputs whose concrete shape is still unknown."""
    return [o for node in model.graph.node for o in node.output if o and shapes.get(o) is None]


@functools.cache
def _symbolic_shape_inference() -> Any:
    """onnxruntime's ``SymbolicShapeInference`` class, loaded from its file: importing it as
    ``onnxruntime.tools.symbolic_shape_infer`` runs ``onnxruntime/tools/__init__.py``, which imports torch
    when it is installed (seconds) for a helper farm does not use."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise ImportError("onnxruntime is not installed")
    path = Path(spec.origin).parent / "tools" / "symbolic_shape_infer.py"
    file_spec = importlib.util.spec_from_file_location("farm_ort_symbolic_shape_infer", path)
    if file_spec is None or file_spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module.SymbolicShapeInference


def _symbolic_infer(model: Any) -> Any:
    """ONNX Runtime's symbolic shape inference on ``model`` (auto-merging dims), keeping what it inferred when
    it could not infer everything. Its own ``SymbolicShapeInference.infer_shapes`` would then write
    ``sym_shape_infer_temp.onnx`` and external-data files into the current directory before it raises, so
    farm drives the same steps itself, without that last one."""
    sym = _symbolic_shape_inference()(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    sym._preprocess(model)
    while sym.run_:
        sym._infer_impl()
    sym._update_output_from_vi()
    return sym.out_mp_


def infer_shapes(model: Any, inputs: list[TensorSpec], batch: int = 1) -> tuple[Any, dict[str, Shape | None],
                                                                                 dict[str, int]]:
    """(inferred model, name -> concrete dims or None, name -> elem_type) with the graph inputs fixed to
    ``[batch, *spec.shape]`` (see module doc: ONNX inference, then ONNX Runtime's symbolic inference)."""
    fixed = fix_input_shapes(model, inputs, batch=batch)
    del fixed.graph.value_info[:]  # an exporter's symbolic intermediate shapes would mask the concrete ones
    inferred = infer_onnx_shapes(fixed)
    shapes, types = _shape_table(inferred)
    if not _unresolved(inferred, shapes):
        return inferred, shapes, types
    try:
        symbolic = _symbolic_infer(fixed)
    except Exception:  # noqa: BLE001 - ops it does not know, or no sympy; keep what ONNX inferred
        return inferred, shapes, types
    more_shapes, more_types = _shape_table(symbolic)
    for name, dims in more_shapes.items():
        if shapes.get(name) is None and dims is not None:
            shapes[name] = dims
            types[name] = types.get(name) or more_types.get(name, 0)
    return inferred, shapes, types


def _activations(model: Any, shapes: dict[str, Shape | None], types: dict[str, int]) -> tuple[int, int, bool]:
    """(sum of node-output bytes, peak live bytes incl. graph inputs, all known)."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    outputs = {o.name for o in g.output}

    def nbytes(name: str) -> int | None:
        s = shapes.get(name)
        size = ITEMSIZE.get(types.get(name, 0))
        return None if s is None or size is None else prod(s) * size

    last_use: dict[str, int] = {}
    for i, node in enumerate(g.node):
        for name in node.input:
            last_use[name] = i
    known = True
    live: dict[str, int] = {}
    for gi in onnx_graph_inputs(model):
        b = nbytes(gi.name)
        known &= b is not None
        live[gi.name] = b or 0
    total, peak = 0, sum(live.values())
    for i, node in enumerate(g.node):
        if node.op_type == "Constant":
            continue
        for name in node.output:
            if not name:
                continue
            b = nbytes(name)
            known &= b is not None
            total += b or 0
            live[name] = b or 0
        peak = max(peak, sum(live.values()))
        for name in list(live):
            if name not in outputs and name not in inits and last_use.get(name, -1) <= i:
                del live[name]
    return total, peak, known


def _count_ops(
    graph: Any, shapes: dict[str, Shape | None]
) -> tuple[dict[str, dict[str, Any]], dict[str, int], int, int, bool]:
    """Per-op ``{count, macs, flops}``, unknown ops, MAC and FLOP totals, whether any cost was known."""
    ops: dict[str, dict[str, Any]] = {}
    unknown: dict[str, int] = {}
    macs_total = flops_total = 0
    any_known = False
    for node in graph.node:
        entry = ops.setdefault(node.op_type, {"count": 0, "macs": 0, "flops": 0})
        entry["count"] += 1
        handler = HANDLERS.get(node.op_type)
        cost: Cost | None = None
        if handler is not None:
            try:
                cost = handler(_Node(node, shapes))
            except (_Unknown, TypeError, IndexError, ZeroDivisionError):
                cost = None  # a shape the inference could not resolve
        if cost is None:
            unknown[node.op_type] = unknown.get(node.op_type, 0) + 1
            entry["macs"] = entry["flops"] = None
            continue
        any_known = True
        macs_total += cost[0]
        flops_total += cost[1]
        if entry["macs"] is not None:
            entry["macs"] += cost[0]
            entry["flops"] += cost[1]
    return ops, unknown, macs_total, flops_total, any_known


def node_costs(model: Any, inputs: list[TensorSpec], batch: int = 1) -> list[LayerCost]:
    """Per graph node at ``batch`` (one batch call, not per sample): name as ONNX Runtime reports it (the node's
    name, else ``<OpType>_<index>``), op type, MACs and FLOPs (None: no rule or shape), parameters (elements of
    its initializer inputs) and their bytes, and the bytes of its outputs (None: a shape unknown). The layer-wise
    view ``farm analyze --layers`` joins with an op profile by these names."""
    inferred, shapes, types = infer_shapes(model, inputs, batch=batch)
    inits = {i.name: i for i in model.graph.initializer}
    rows: list[LayerCost] = []
    for i, node in enumerate(inferred.graph.node):
        cost: Cost | None = None
        handler = HANDLERS.get(node.op_type)
        if handler is not None:
            try:
                cost = handler(_Node(node, shapes))
            except (_Unknown, TypeError, IndexError, ZeroDivisionError):
                cost = None
        params = [inits[n] for n in node.input if n in inits]
        out_bytes: int | None = 0
        for name in node.output:
            dims, size = shapes.get(name), ITEMSIZE.get(types.get(name, 0))
            out_bytes = None if out_bytes is None or dims is None or size is None else out_bytes + prod(dims) * size
        rows.append(LayerCost(name=node.name or f"{node.op_type}_{i}", op_type=node.op_type,
                              macs=cost[0] if cost else None, flops=cost[1] if cost else None,
                              params=sum(prod(p.dims) for p in params),
                              param_bytes=sum(prod(p.dims) * ITEMSIZE.get(p.data_type, 4) for p in params),
                              activation_bytes=out_bytes))
    return rows


_BETWEEN = frozenset({"Mul", "Div", "Add", "Sub", "Where", "Cast", "Dropout", "Identity"})


def attention_subgraphs(graph: Any) -> int:
    """How many Softmax nodes sit between two MatMuls (``MatMul -> [scale/mask ops] -> Softmax -> MatMul``):
    attention written out, as exporters emit it (its cost is counted op by op)."""
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def reaches(start: Any, step: Callable[[Any], list[Any]]) -> bool:
        frontier = step(start)
        for _ in range(4):  # a few scale/mask/cast ops at most
            if any(n.op_type == "MatMul" for n in frontier):
                return True
            frontier = [m for n in frontier if n.op_type in _BETWEEN for m in step(n)]
        return False

    def up(n: Any) -> list[Any]:
        return [producer[i] for i in n.input if i in producer]

    def down(n: Any) -> list[Any]:
        return [c for o in n.output for c in consumers.get(o, [])]

    return sum(1 for n in graph.node if n.op_type == "Softmax" and reaches(n, up) and reaches(n, down))


def _parameters(model: Any, inputs: list[TensorSpec]) -> tuple[int, int, str | None]:
    """Parameter count, parameter bytes, and the KServe dtype holding most parameter bytes."""
    params = sum(prod(i.dims) for i in model.graph.initializer)
    by_type: dict[int, int] = {}
    for i in model.graph.initializer:
        by_type[i.data_type] = by_type.get(i.data_type, 0) + prod(i.dims) * ITEMSIZE.get(i.data_type, 0)
    param_bytes = sum(by_type.values())
    weights = {t: b for t, b in by_type.items() if t not in (6, 7)}  # INT32/INT64 are shapes and indices
    dominant = max(weights, key=lambda t: weights[t]) if weights else None
    dtype = ONNX_TO_KSERVE.get(dominant) if dominant is not None else (inputs[0].dtype if inputs else None)
    return params, param_bytes, dtype


def analyze_onnx_model(model: Any, inputs: list[TensorSpec], batch: int = 1) -> dict[str, Any]:
    """Static metrics of a parsed ONNX model whose per-sample inputs are ``inputs`` (see module doc).

    Shapes are inferred at ``batch`` (pass a static model's fixed batch size) and every count is divided
    by it, so results are per sample.
    """
    inferred, shapes, types = infer_shapes(model, inputs, batch=batch)
    ops, unknown, macs_total, flops_total, any_known = _count_ops(inferred.graph, shapes)
    act_sum, act_peak, act_known = _activations(inferred, shapes, types)
    params, param_bytes, dtype = _parameters(model, inputs)
    if batch > 1:
        macs_total, flops_total, act_sum, act_peak = (v // batch for v in (macs_total, flops_total, act_sum,
                                                                           act_peak))
        for entry in ops.values():
            for key in ("macs", "flops"):
                if entry[key] is not None:
                    entry[key] //= batch
    return {
        "params": params,
        "param_bytes": param_bytes,
        **totals(macs_total, flops_total, unknown, any_known or not inferred.graph.node),
        "activation_bytes_per_sample": act_sum if act_known else None,
        "activation_peak_bytes_per_sample": act_peak if act_known else None,
        "ops": dict(sorted(ops.items())),
        "dtype": dtype,
        "complete": not unknown and act_known,
        "unknown_ops": unknown,
        "attention_subgraphs": attention_subgraphs(inferred.graph),
    }


def totals(macs: int, flops: int, unknown: dict[str, int], any_known: bool) -> dict[str, int | None]:
    """``macs_per_sample``/``flops_per_sample`` (None unless every op was counted) and
    ``macs_at_least``/``flops_at_least`` (the counted part, a lower bound, when some op was not)."""
    complete = not unknown and any_known
    partial = bool(unknown) and any_known
    return {"macs_per_sample": macs if complete else None, "flops_per_sample": flops if complete else None,
            "macs_at_least": macs if partial else None, "flops_at_least": flops if partial else None}

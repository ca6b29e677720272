"""Real architectures as ONNX graphs built from code (no torch needed): a BERT-style encoder and ResNet-18.

Weights are seeded random numbers; initializer names are the PyTorch ``state_dict`` keys of the mirror
modules in ``farm.models.torch_architectures`` (linear weights stored ``[in, out]`` for MatMul, i.e.
transposed), so both formats compute the same function. Building twice gives identical bytes.

- ``bert_model``: token + position embeddings, LayerNorm, ``layers`` post-LN encoder layers (separate
  q/k/v/out projections, scaled dot product attention as MatMul/Mul/Softmax/MatMul, erf GELU FFN), mean
  pooling. Input ``input_ids`` INT64 [batch, seq] (both axes dynamic), output ``output`` FP32 [batch, hidden].
- ``resnet_model``: ResNet-18 (torchvision layout: 7x7/2 stem, BN, ReLU, 3x3/2 max pool, 4 stages of 2
  basic blocks with 1x1 projection shortcuts, global average pool, fully connected). Input ``input`` FP32
  [batch, 3, image, image] (batch dynamic), output ``output`` [batch, classes]; ``width`` is the first
  stage's channel count.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from farm.errors import RequestError
from farm.models.spec import onnx_modules

OPSET = 17
IR_VERSION = 8
SEED = 0
#: Per-sample input shapes the example files are analysed and profiled at.
BERT_SEQ = 128
BERT_DEFAULTS: dict[str, int] = {"vocab": 30522, "hidden": 256, "layers": 6, "heads": 4, "ffn": 1024,
                                 "max_positions": 512}
RESNET_DEFAULTS: dict[str, int] = {"width": 64, "classes": 1000, "image": 224}
RESNET_BLOCKS = (2, 2, 2, 2)


class _Graph:
    """A tiny ONNX graph builder: seeded initializers and auto-named node outputs."""

    def __init__(self) -> None:
        self.rng = np.random.RandomState(SEED)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def const(self, name: str, arr: np.ndarray) -> str:
        _, _, numpy_helper = onnx_modules()
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def randn(self, name: str, shape: tuple[int, ...], scale: float, offset: float = 0.0) -> str:
        return self.const(name, (offset + self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        _, helper, _ = onnx_modules()
        if out is None:
            self._n += 1
            out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def linear(self, x: str, prefix: str, n_in: int, n_out: int) -> str:
        w = self.randn(f"{prefix}.weight", (n_in, n_out), np.sqrt(1.0 / n_in))
        b = self.randn(f"{prefix}.bias", (n_out,), 0.02)
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, prefix: str, n: int) -> str:
        w = self.randn(f"{prefix}.weight", (n,), 0.1, 1.0)
        b = self.randn(f"{prefix}.bias", (n,), 0.02)
        return self.op("LayerNormalization", [x, w, b], axis=-1, epsilon=1e-12)

    def model(self, name: str, inputs: list[Any], outputs: list[Any]) -> Any:
        onnx, helper, _ = onnx_modules()
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="farm")
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def _positive(kind: str, **kw: int) -> None:
    bad = [f"{k}={v}" for k, v in kw.items() if not isinstance(v, int) or v <= 0]
    if bad:
        raise RequestError(f"{kind} needs positive integer sizes, got {', '.join(bad)}")


def _encoder_layer(g: _Graph, x: str, p: str, hidden: int, heads: int, ffn: int) -> str:
    dh = hidden // heads
    split = g.const(f"{p}.split_shape", np.array([0, 0, heads, dh], dtype=np.int64))
    merge = g.const(f"{p}.merge_shape", np.array([0, 0, hidden], dtype=np.int64))

    def heads_of(name: str, perm: list[int]) -> str:
        return g.op("Transpose", [g.op("Reshape", [g.linear(x, f"{p}.attn.{name}", hidden, hidden), split])],
                    perm=perm)

    q, k_t, v = heads_of("q", [0, 2, 1, 3]), heads_of("k", [0, 2, 3, 1]), heads_of("v", [0, 2, 1, 3])
    scale = g.const(f"{p}.attn.scale", np.array(1.0 / np.sqrt(dh), dtype=np.float32))
    probs = g.op("Softmax", [g.op("Mul", [g.op("MatMul", [q, k_t]), scale])], axis=-1)
    ctx = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3]), merge])
    x = g.layer_norm(g.op("Add", [x, g.linear(ctx, f"{p}.attn.out", hidden, hidden)]), f"{p}.ln1", hidden)
    h = g.linear(x, f"{p}.ffn.up", hidden, ffn)
    erf = g.op("Erf", [g.op("Div", [h, g.const(f"{p}.ffn.sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))])])
    one = g.const(f"{p}.ffn.one", np.array(1.0, dtype=np.float32))
    half = g.const(f"{p}.ffn.half", np.array(0.5, dtype=np.float32))
    gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, one])]), half])
    return g.layer_norm(g.op("Add", [x, g.linear(gelu, f"{p}.ffn.down", ffn, hidden)]), f"{p}.ln2", hidden)


def bert_model(vocab: int = 30522, hidden: int = 256, layers: int = 6, heads: int = 4, ffn: int = 1024,
               max_positions: int = 512) -> Any:
    """BERT-style encoder (see module doc); sequences up to ``max_positions`` tokens."""
    onnx, helper, _ = onnx_modules()
    _positive("bert", vocab=vocab, hidden=hidden, layers=layers, heads=heads, ffn=ffn, max_positions=max_positions)
    if hidden % heads:
        raise RequestError(f"bert needs hidden ({hidden}) divisible by heads ({heads})")
    g = _Graph()
    tok = g.randn("embeddings.word.weight", (vocab, hidden), 0.02)
    pos = g.randn("embeddings.position.weight", (max_positions, hidden), 0.02)
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const("axis1", np.array(1, dtype=np.int64))], axis=0)
    positions = g.op("Range", [g.const("zero", np.array(0, dtype=np.int64)), seq,
                               g.const("one", np.array(1, dtype=np.int64))])
    x = g.op("Add", [g.op("Gather", [tok, "input_ids"]), g.op("Gather", [pos, positions])])
    x = g.layer_norm(x, "embeddings.ln", hidden)
    for i in range(layers):
        x = _encoder_layer(g, x, f"layers.{i}", hidden, heads, ffn)
    g.op("ReduceMean", [x], out="output", axes=[1], keepdims=0)
    return g.model("bert", [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["batch", "seq"])],
                   [helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, ["batch", hidden])])


def _conv_bn(g: _Graph, x: str, p: str, bn: str, c_in: int, c_out: int, k: int, stride: int) -> str:
    w = g.randn(f"{p}.weight", (c_out, c_in, k, k), np.sqrt(2.0 / (c_in * k * k)))
    y = g.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    scale, bias = g.randn(f"{bn}.weight", (c_out,), 0.1, 1.0), g.randn(f"{bn}.bias", (c_out,), 0.1)
    mean = g.randn(f"{bn}.running_mean", (c_out,), 0.1)
    var = g.const(f"{bn}.running_var", (1.0 + np.abs(g.rng.standard_normal(c_out)) * 0.1).astype(np.float32))
    return g.op("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)


def _basic_block(g: _Graph, x: str, p: str, c_in: int, c_out: int, stride: int) -> str:
    h = g.op("Relu", [_conv_bn(g, x, f"{p}.conv1", f"{p}.bn1", c_in, c_out, 3, stride)])
    h = _conv_bn(g, h, f"{p}.conv2", f"{p}.bn2", c_out, c_out, 3, 1)
    if stride != 1 or c_in != c_out:
        x = _conv_bn(g, x, f"{p}.downsample.0", f"{p}.downsample.1", c_in, c_out, 1, stride)
    return g.op("Relu", [g.op("Add", [h, x])])


def resnet_model(width: int = 64, classes: int = 1000, image: int = 224) -> Any:
    """ResNet-18 (see module doc) on ``image`` x ``image`` RGB inputs (>= 32)."""
    onnx, helper, _ = onnx_modules()
    _positive("resnet18", width=width, classes=classes, image=image)
    g = _Graph()
    x = g.op("Relu", [_conv_bn(g, "input", "conv1", "bn1", 3, width, 7, 2)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = width
    for stage, blocks in enumerate(RESNET_BLOCKS):
        c_out = width * 2 ** stage
        for b in range(blocks):
            x = _basic_block(g, x, f"layer{stage + 1}.{b}", c_in, c_out, 2 if b == 0 and stage > 0 else 1)
            c_in = c_out
    flat = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    fc_w = g.randn("fc.weight", (classes, c_in), np.sqrt(1.0 / c_in))
    g.op("Gemm", [flat, fc_w, g.randn("fc.bias", (classes,), 0.01)], out="output", transB=1)
    return g.model("resnet18",
                   [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["batch", 3, image, image])],
                   [helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, ["batch", classes])])

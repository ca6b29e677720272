"""Tests for farm.models.analysis: MACs/FLOPs against hand-computed formulas, params, activation bytes."""
from __future__ import annotations

import os
from math import prod
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.errors import ModelError
from farm.models.analysis import analyze, headline
from farm.models.examples import COMPUTE_DIM, COMPUTE_ROWS, ONNX_KINDS, build_example, compute_layers
from farm.models.info import inspect_model, tensor_spec


def build(path: Path, nodes: list, in_dims: list, out_dims: list, weights: dict[str, tuple[int, ...]],
          opset: int = 17) -> Path:
    """An ONNX model with input ``x`` [batch, *in_dims], output ``y`` and random initializers ``weights``."""
    rng = np.random.RandomState(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in weights.items()]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", *in_dims])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", *out_dims])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def run_shape(path: Path, in_dims: list) -> tuple[int, ...]:
    """Output shape at batch 1 from onnxruntime (cross-checks the formula's output size)."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": np.zeros((1, *in_dims), np.float32)})
    return y.shape


def test_single_conv_with_bias(tmp_path: Path) -> None:
    p = build(tmp_path / "conv.onnx",
              [helper.make_node("Conv", ["x", "w", "bias"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
              [3, 16, 16], [8, 16, 16], {"w": (8, 3, 3, 3), "bias": (8,)})
    r = analyze(p)
    macs = 8 * 16 * 16 * (3 * 3 * 3)  # out elements * C_in * kh * kw
    assert r["macs_per_sample"] == macs
    assert r["flops_per_sample"] == 2 * macs + 8 * 16 * 16  # + one bias add per output element
    assert r["ops"] == {"Conv": {"count": 1, "macs": macs, "flops": 2 * macs + 8 * 16 * 16}}
    assert r["params"] == 8 * 27 + 8
    assert r["complete"] is True


def test_conv_groups_dilation_stride(tmp_path: Path) -> None:
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], group=4, dilations=[2, 2],
                            strides=[2, 2])
    p = build(tmp_path / "gconv.onnx", [node], [8, 17, 17], [16, 7, 7], {"w": (16, 2, 3, 3)})
    assert run_shape(p, [8, 17, 17]) == (1, 16, 7, 7)  # (17 - 2*(3-1) - 1) // 2 + 1 = 7
    macs = 16 * 7 * 7 * (8 // 4) * 3 * 3
    r = analyze(p)
    assert r["macs_per_sample"] == macs
    assert r["flops_per_sample"] == 2 * macs  # no bias


def test_conv_transpose(tmp_path: Path) -> None:
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2])
    p = build(tmp_path / "deconv.onnx", [node], [4, 5, 5], [6, 11, 11], {"w": (4, 6, 3, 3)})
    assert run_shape(p, [4, 5, 5]) == (1, 6, 11, 11)
    assert analyze(p)["macs_per_sample"] == (4 * 5 * 5) * 6 * 3 * 3  # in elements * C_out * kh * kw


@pytest.mark.parametrize("trans_a", [0, 1])
def test_gemm(tmp_path: Path, trans_a: int) -> None:
    if trans_a:  # Gemm with transA on a [b, 64] input would need b == K; use a [64, b]-free variant:
        node = helper.make_node("Gemm", ["xt", "w", "c"], ["y"], transA=1, transB=1)
        nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]), node]
    else:
        nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1)]
    p = build(tmp_path / "gemm.onnx", nodes, [64], [32], {"w": (32, 64), "c": (32,)})
    r = analyze(p)
    assert r["macs_per_sample"] == 64 * 32  # M=1, K=64, N=32
    assert r["ops"]["Gemm"]["flops"] == 2 * 64 * 32 + 32
    assert r["params"] == 32 * 64 + 32


def test_matmul_batched(tmp_path: Path) -> None:
    p = build(tmp_path / "mm.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"])], [4, 8, 16], [4, 8, 5],
              {"w": (16, 5)})
    r = analyze(p)
    assert r["macs_per_sample"] == 4 * 8 * 5 * 16  # out elements * K
    assert r["flops_per_sample"] == 2 * 4 * 8 * 5 * 16


def test_matmul_broadcast_both_batched(tmp_path: Path) -> None:
    p = build(tmp_path / "bmm.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"])], [3, 8, 16], [3, 8, 4],
              {"w": (3, 16, 4)})
    assert run_shape(p, [3, 8, 16]) == (1, 3, 8, 4)
    assert analyze(p)["macs_per_sample"] == 3 * 8 * 4 * 16


def test_batchnorm_pool_softmax_elementwise(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["a"]),
        helper.make_node("AveragePool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Softmax", ["f"], ["y"], axis=1),
    ]
    w = {"s": (4,), "bb": (4,), "m": (4,), "v": (4,)}
    p = build(tmp_path / "misc.onnx", nodes, [4, 8, 8], [64], w)
    r = analyze(p)
    e = 4 * 8 * 8
    ops = r["ops"]
    assert ops["BatchNormalization"] == {"count": 1, "macs": e, "flops": 2 * e}
    assert ops["Relu"]["flops"] == e and ops["Add"]["flops"] == e
    assert ops["AveragePool"]["flops"] == (e // 4) * 4
    assert ops["Flatten"]["flops"] == 0
    assert ops["Softmax"]["flops"] == 3 * 64
    assert r["macs_per_sample"] == e
    assert r["flops_per_sample"] == 2 * e + e + e + e + 3 * 64


def test_convnet_hand_computed(tmp_path: Path) -> None:
    r = analyze(build_example("convnet", tmp_path / "convnet.onnx"))
    conv1 = (16 * 32 * 32) * (3 * 3 * 3)
    conv2 = (32 * 16 * 16) * (16 * 3 * 3)
    fc = 32 * 10
    assert r["macs_per_sample"] == conv1 + conv2 + fc == 1_622_336
    flops = (2 * conv1 + 16 * 32 * 32) + (2 * conv2 + 32 * 16 * 16) + (2 * fc + 10)  # with bias adds
    flops += 16 * 32 * 32 + 32 * 16 * 16  # two Relus
    flops += (16 * 16 * 16) * 4  # MaxPool 2x2 over 16x16x16 outputs
    flops += 32 * 16 * 16  # GlobalAveragePool reads every element
    assert r["flops_per_sample"] == flops
    assert r["params"] == 16 * 27 + 16 + 32 * 144 + 32 + 32 * 10 + 10
    assert r["dtype"] == "FP32"
    assert r["inputs"] == ["input:FP32:3x32x32"]


@pytest.mark.parametrize("kind", ONNX_KINDS)
def test_params_equal_initializer_sizes(kind: str, tmp_path: Path) -> None:
    opts = {"compute": {"ms": 0.5}, "memory": {"mb": 2}, "resnet18": {"width": 8, "image": 32},
            "bert-tiny": {"vocab": 500, "hidden": 32, "layers": 1, "heads": 2, "ffn": 64}}.get(kind, {})
    path = build_example(kind, tmp_path / f"{kind}.onnx", **opts)
    model = onnx.load(str(path))
    r = analyze(path, None, [tensor_spec("input_ids:INT64:16")] if kind == "bert-tiny" else None)
    assert r["params"] == sum(numpy_helper.to_array(i).size for i in model.graph.initializer)
    assert r["param_bytes"] == sum(numpy_helper.to_array(i).nbytes for i in model.graph.initializer)
    assert r["size_bytes"] == path.stat().st_size
    assert r["macs_per_sample"] is not None and r["flops_per_sample"] is not None
    assert r["complete"] is True and r["unknown_ops"] == {}


def test_mlp_activation_sum_and_peak(tmp_path: Path) -> None:
    r = analyze(build_example("mlp", tmp_path / "mlp.onnx"))
    assert r["macs_per_sample"] == 256 * 512 + 512 * 256 + 256 * 10
    assert r["activation_bytes_per_sample"] == (512 + 512 + 256 + 256 + 10) * 4
    # peak: while the first Relu runs, the Gemm output (512) and the Relu output (512) are live.
    assert r["activation_peak_bytes_per_sample"] == (512 + 512) * 4


def test_memory_model_activation(tmp_path: Path) -> None:
    r = analyze(build_example("memory", tmp_path / "mem.onnx", mb=64))
    assert r["activation_bytes_per_sample"] >= 2 * 64 * (1 << 20)  # Expand output + Mul output
    assert r["activation_peak_bytes_per_sample"] >= 2 * 64 * (1 << 20)
    assert r["dtype"] == "FP32"  # int64 shape initializers do not count as the model's dtype


def test_compute_model_macs(tmp_path: Path) -> None:
    r = analyze(build_example("compute", tmp_path / "c.onnx", ms=3.0))
    assert r["macs_per_sample"] == compute_layers(3.0) * COMPUTE_ROWS * COMPUTE_DIM * COMPUTE_DIM


def test_unknown_op_is_not_zero(tmp_path: Path) -> None:
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], transB=1), helper.make_node("Hardmax", ["g"], ["y"])]
    p = build(tmp_path / "hm.onnx", nodes, [8], [4], {"w": (4, 8)})
    r = analyze(p)
    assert r["ops"]["Hardmax"] == {"count": 1, "macs": None, "flops": None}
    assert r["complete"] is False and r["unknown_ops"] == {"Hardmax": 1}
    assert r["macs_per_sample"] is None and r["flops_per_sample"] is None  # never a plain (wrong) total
    assert r["macs_at_least"] == 8 * 4 and r["flops_at_least"] == 2 * 8 * 4  # the counted part
    assert headline(r, "macs_per_sample") == ">= 32 (missing: Hardmax x1)"
    assert any("Hardmax" in n and "lower bound" in n for n in r["notes"])


def test_dynamic_dims_use_given_inputs(tmp_path: Path) -> None:
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    p = build(tmp_path / "dyn.onnx", [node], [3, "h", "w_"], [4, "h", "w_"], {"w": (4, 3, 3, 3)})
    with pytest.raises(ModelError, match="--input"):
        analyze(p)
    r = analyze(p, "onnx", [tensor_spec("x:FP32:3x10x12")])
    assert r["macs_per_sample"] == 4 * 10 * 12 * 27
    with pytest.raises(ModelError, match="do not match"):
        analyze(p, "onnx", [tensor_spec("x:FP32:5x10x12")])


def test_activation_bytes_match_onnxruntime_outputs(tmp_path: Path) -> None:
    """Cross-check: the sum of intermediate sizes equals what onnxruntime produces for every value."""
    path = build_example("convnet", tmp_path / "convnet.onnx")
    model = onnx.load(str(path))
    names = [o for n in model.graph.node for o in n.output]
    for name in names:
        if name not in {o.name for o in model.graph.output}:
            model.graph.output.append(helper.make_empty_tensor_value_info(name))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values = sess.run(names, {"input": np.zeros((1, 3, 32, 32), np.float32)})
    assert analyze(path)["activation_bytes_per_sample"] == sum(v.nbytes for v in values)
    assert prod(values[-1].shape) == 10


@pytest.mark.parametrize("kind", ["mlp", "convnet"])
def test_torchscript_matches_onnx(kind: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ts = analyze(build_example(f"torchscript-{kind}", tmp_path / f"{kind}.pt"))
    ox = analyze(build_example(kind, tmp_path / f"{kind}.onnx"))
    assert ts["format"] == "torchscript"
    assert ts["params"] == ox["params"] and ts["param_bytes"] == ox["param_bytes"]
    assert ts["macs_per_sample"] == ox["macs_per_sample"]
    assert ts["flops_per_sample"] == ox["flops_per_sample"]
    assert ts["activation_bytes_per_sample"] > 0
    assert ts["activation_peak_bytes_per_sample"] is None  # not tracked for TorchScript
    assert ts["complete"] is True and ts["dtype"] == "FP32"


def test_torchscript_unknown_op_and_given_inputs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Odd(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(6, 3)

        def forward(self, x):  # noqa: ANN001, ANN201
            return torch.cumsum(self.fc(x), dim=1)

    p = tmp_path / "odd.pt"
    torch.jit.script(Odd()).save(str(p))
    r = analyze(p, "torchscript", [tensor_spec("x:FP32:6")])
    assert r["params"] == 6 * 3 + 3
    assert r["macs_per_sample"] is None and r["macs_at_least"] == 6 * 3
    assert headline(r, "macs_per_sample") == ">= 18 (missing: cumsum x1)"
    assert r["unknown_ops"] == {"cumsum": 1} and r["complete"] is False
    with pytest.raises(ModelError, match="--input"):
        analyze(p)


def test_static_batch_counts_per_sample(tmp_path: Path) -> None:
    """A model exported with a fixed batch of 8 reports the same per-sample MACs as a dynamic one."""
    rng = np.random.RandomState(0)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["g"], transB=1),
         helper.make_node("Reshape", ["g", "shape"], ["y"])], "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 2, 2])],
        [numpy_helper.from_array(rng.standard_normal((4, 16)).astype(np.float32), "w"),
         numpy_helper.from_array(np.array([8, 2, 2], dtype=np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    p = tmp_path / "static8.onnx"
    onnx.save(model, str(p))
    r = analyze(p)
    assert r["macs_per_sample"] == 16 * 4
    assert r["activation_bytes_per_sample"] == (4 + 4) * 4  # Gemm output + Reshape output, per sample
    assert r["inputs"] == ["x:FP32:16"]
    info = inspect_model(p)
    assert info.static_batch == 8 and info.dynamic_batch is False
    assert info.outputs[0].shape == (2, 2)  # inferred at batch 8, per sample


def test_quantized_convnet(tmp_path: Path) -> None:
    """onnxruntime's static quantization (QOperator): QLinearConv keeps the float MACs; contrib ops whose
    shapes ONNX cannot infer are reported unknown, not 0."""
    quant = pytest.importorskip("onnxruntime.quantization")

    class Reader(quant.CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"input": np.random.RandomState(i).rand(1, 3, 32, 32).astype(np.float32)}
                            for i in range(4)])

        def get_next(self) -> dict | None:
            return next(self.it, None)

    src = build_example("convnet", tmp_path / "convnet.onnx")
    dst = tmp_path / "convnet_q.onnx"
    quant.quantize_static(str(src), str(dst), Reader(), quant_format=quant.QuantFormat.QOperator,
                          activation_type=quant.QuantType.QUInt8, weight_type=quant.QuantType.QUInt8)
    r = analyze(dst)
    conv_macs = (16 * 32 * 32) * 27 + (32 * 16 * 16) * 144
    assert r["ops"]["QLinearConv"] == {"count": 2, "macs": conv_macs, "flops": 2 * conv_macs + 16 * 32 * 32
                                       + 32 * 16 * 16}
    assert r["dtype"] == "UINT8"
    assert r["complete"] is False and r["unknown_ops"]
    assert all(r["ops"][op]["macs"] is None for op in r["unknown_ops"])


def test_incomplete_shape_inference_writes_nothing_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Reshape whose target shape comes from an op nobody knows leaves ONNX's and ONNX Runtime's shape
    inference incomplete; analysis still counts the rest, and leaves no file behind where it ran (ONNX
    Runtime's own entry point writes ``sym_shape_infer_temp.onnx`` and external data there)."""
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], transB=1), helper.make_node("Shape", ["g"], ["s"]),
             helper.make_node("Mystery", ["s"], ["s2"], domain="com.example"),
             helper.make_node("Reshape", ["g", "s2"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "n"])],
                              [numpy_helper.from_array(np.ones((4, 8), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    p = tmp_path / "mystery.onnx"
    onnx.save(model, str(p))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    r = analyze(p)
    assert r["macs_at_least"] == 8 * 4 and r["complete"] is False
    assert sorted(os.listdir(cwd)) == []

"""Static metrics on real architectures (BERT-style encoder, ResNet-18): farm's ONNX graphs, the same
modules exported by ``torch.onnx.export`` (dynamic batch and sequence axes) and TorchScript, against
the analytic MAC counts written from the hyperparameters."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from farm.models.analysis import analyze, headline
from farm.models.architectures import BERT_DEFAULTS, RESNET_DEFAULTS, bert_model, resnet_model
from farm.models.info import tensor_spec

BERT = {"vocab": 1000, "hidden": 64, "layers": 2, "heads": 4, "ffn": 128, "max_positions": 256}
RESNET = {"width": 16, "classes": 10, "image": 64}


def bert_macs(seq: int, hidden: int, layers: int, ffn: int, **_: int) -> int:
    """Per layer: q/k/v/out projections 4*L*d^2, scores and weighted sum 2*L^2*d, FFN 2*L*d*f."""
    return layers * (4 * seq * hidden**2 + 2 * seq**2 * hidden + 2 * seq * hidden * ffn)


def resnet18_macs(width: int, classes: int, image: int, batchnorm: bool = True) -> int:
    """Convolutions (out pixels * C_out * C_in * k^2), BatchNorm (1 per element, farm's rule) and fc."""
    total = 0

    def conv(size: int, c_in: int, c_out: int, k: int, stride: int) -> int:
        nonlocal total
        out = (size + 2 * (k // 2) - k) // stride + 1
        total += out * out * c_out * (c_in * k * k + (1 if batchnorm else 0))
        return out

    size = conv(image, 3, width, 7, 2)
    size = (size + 2 - 3) // 2 + 1  # 3x3/2 max pool, pad 1
    c_in = width
    for stage in range(4):
        c_out, stride = width * 2**stage, 1 if stage == 0 else 2
        if stride != 1 or c_in != c_out:
            conv(size, c_in, c_out, 1, stride)
        size = conv(size, c_in, c_out, 3, stride)
        for _ in range(3):
            conv(size, c_out, c_out, 3, 1)
        c_in = c_out
    return total + c_in * classes


def close(value: int | None, expected: int, tol: float = 0.02) -> bool:
    return value is not None and abs(value - expected) <= tol * expected


def export_onnx(module: object, example: object, path: Path, names: list[str], dynamic: dict,
                opset: int = 17) -> Path:
    """``torch.onnx.export`` with the TorchScript-based exporter (offline: the dynamo exporter needs
    onnxscript)."""
    import torch

    torch.onnx.export(module, (example,), str(path), input_names=names, output_names=["output"],
                      dynamic_axes={**dynamic, "output": {0: "batch"}}, opset_version=opset, dynamo=False)
    return path


def test_bert_onnx_macs_match_analytic(tmp_path: Path) -> None:
    p = tmp_path / "bert.onnx"
    onnx.save(bert_model(**BERT), str(p))
    for seq in (128, 32):  # shapes follow the given sequence length through Shape/Range/Reshape
        r = analyze(p, "onnx", [tensor_spec(f"input_ids:INT64:{seq}")])
        assert r["complete"] is True and r["unknown_ops"] == {}
        assert r["macs_per_sample"] == bert_macs(seq, **BERT)
        assert r["ops"]["Softmax"]["flops"] == 3 * BERT["layers"] * BERT["heads"] * seq * seq
        assert r["activation_bytes_per_sample"] is not None and r["activation_peak_bytes_per_sample"] is not None
        assert r["attention_subgraphs"] == BERT["layers"]


def test_bert_torch_export_and_torchscript(tmp_path: Path) -> None:
    """The exporter's graph (Shape/Gather/Concat feeding Reshape, symbolic value_info) and TorchScript
    (scaled_dot_product_attention) count the same MACs as the analytic formula."""
    torch = pytest.importorskip("torch")
    from farm.models.torch_architectures import bert_module

    module = bert_module(**BERT)
    exported = export_onnx(module, torch.zeros(1, 16, dtype=torch.long), tmp_path / "bert_export.onnx",
                           ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}})
    scripted = tmp_path / "bert.pt"
    torch.jit.script(module).save(str(scripted))
    spec = [tensor_spec("input_ids:INT64:128")]
    ox, ts = analyze(exported, "onnx", spec), analyze(scripted, "torchscript", spec)
    expected = bert_macs(128, **BERT)
    assert ox["complete"] is True and ts["complete"] is True
    assert ox["attention_subgraphs"] == ts["attention_subgraphs"] == BERT["layers"]
    assert close(ox["macs_per_sample"], expected) and close(ts["macs_per_sample"], expected)
    assert close(ts["macs_per_sample"], ox["macs_per_sample"], 0.001)
    assert close(ts["flops_per_sample"], ox["flops_per_sample"])
    sdpa = [op for op in ts["ops"] if "scaled_dot_product" in op]
    assert sdpa and all(ts["ops"][op]["macs"] == 2 * BERT["layers"] * 128 * 128 * BERT["hidden"] for op in sdpa)

    # opset 14: LayerNorm decomposed (ReduceMean/Sub/Pow/Sqrt/Div/...), every op counted, the same MACs
    old_opset = export_onnx(module, torch.zeros(1, 16, dtype=torch.long), tmp_path / "bert_opset14.onnx",
                            ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}}, opset=14)
    r14 = analyze(old_opset, "onnx", spec)
    assert "LayerNormalization" not in r14["ops"] and r14["ops"]["ReduceMean"]["count"] > 2 * BERT["layers"]
    assert r14["complete"] is True and r14["macs_per_sample"] == ox["macs_per_sample"]
    assert close(r14["flops_per_sample"], ox["flops_per_sample"])


def test_bert_onnx_and_torchscript_compute_the_same(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from farm.models.torch_architectures import bert_module

    ids = np.random.RandomState(1).randint(0, BERT["vocab"], (2, 24)).astype(np.int64)
    sess = ort.InferenceSession(bert_model(**BERT).SerializeToString(), providers=["CPUExecutionProvider"])
    (a,) = sess.run(None, {"input_ids": ids})
    with torch.no_grad():
        b = torch.jit.script(bert_module(**BERT))(torch.from_numpy(ids)).numpy()
    assert a.shape == (2, BERT["hidden"]) and np.allclose(a, b, atol=1e-4)


def test_resnet18_macs_match_analytic(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from farm.models.torch_architectures import resnet_module

    built = tmp_path / "resnet.onnx"
    onnx.save(resnet_model(**RESNET), str(built))
    module = resnet_module(**RESNET)
    size = RESNET["image"]
    exported = export_onnx(module, torch.zeros(1, 3, size, size), tmp_path / "resnet_export.onnx", ["input"],
                           {"input": {0: "batch"}})
    scripted = tmp_path / "resnet.pt"
    torch.jit.script(module).save(str(scripted))
    spec = [tensor_spec(f"input:FP32:3x{size}x{size}")]
    r_built, r_export, r_ts = (analyze(p, None, spec) for p in (built, exported, scripted))
    assert r_built["macs_per_sample"] == resnet18_macs(**RESNET)
    assert r_ts["macs_per_sample"] == r_built["macs_per_sample"] and r_ts["complete"] is True
    # the exporter folds BatchNorm into the convolutions: 1 MAC per BN element fewer, well within 2 %
    assert r_export["macs_per_sample"] == resnet18_macs(**RESNET, batchnorm=False)
    assert close(r_export["macs_per_sample"], r_ts["macs_per_sample"])


def test_handwritten_attention_counts_like_sdpa(tmp_path: Path) -> None:
    """TorchScript attention written as matmul/softmax/matmul counts the MACs of scaled_dot_product_attention."""
    torch = pytest.importorskip("torch")

    class Manual(torch.nn.Module):
        def forward(self, q, k, v):  # noqa: ANN001, ANN201
            scores = torch.matmul(q, k.transpose(-2, -1)) * (q.size(-1) ** -0.5)
            return torch.matmul(torch.softmax(scores, dim=-1), v)

    class Fused(torch.nn.Module):
        def forward(self, q, k, v):  # noqa: ANN001, ANN201
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    specs = [tensor_spec("q:FP32:4x32x16"), tensor_spec("k:FP32:4x48x16"), tensor_spec("v:FP32:4x48x8")]
    results = []
    for cls in (Manual, Fused):
        p = tmp_path / f"{cls.__name__}.pt"
        torch.jit.script(cls()).save(str(p))
        results.append(analyze(p, "torchscript", specs))
    expected = 4 * 32 * 48 * 16 + 4 * 32 * 48 * 8  # Q K^T + P V
    assert results[0]["macs_per_sample"] == results[1]["macs_per_sample"] == expected
    assert all(r["complete"] for r in results)


def test_onnx_attention_op(tmp_path: Path) -> None:
    """The opset-23 Attention op: S * (Q elements + output elements) MACs."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"])
    graph = helper.make_graph([node], "a", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 4, s, e])
                                            for n, s, e in (("q", 32, 16), ("k", 48, 16), ("v", 48, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4, 32, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    p = tmp_path / "attn.onnx"
    onnx.save(model, str(p))
    r = analyze(p, "onnx", [tensor_spec("q:FP32:4x32x16"), tensor_spec("k:FP32:4x48x16"),
                            tensor_spec("v:FP32:4x48x8")])
    assert r["macs_per_sample"] == 4 * 32 * 48 * (16 + 8) and r["complete"] is True


def test_unknown_only_is_null(tmp_path: Path) -> None:
    """A graph of nothing but an uncountable op has no total and no lower bound: NULL, shown 'unknown'."""
    graph = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"])], "h",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    p = tmp_path / "hardmax.onnx"
    onnx.save(model, str(p))
    r = analyze(p)
    assert r["macs_per_sample"] is None and r["macs_at_least"] is None
    assert headline(r, "macs_per_sample") == "unknown" and headline(r, "params") == "0"


@pytest.mark.slow
def test_full_size_examples_match_analytic(tmp_path: Path) -> None:
    """The ``bert-tiny`` and ``resnet18`` example sizes (ResNet-18 at 224x224: 1.82 GMAC)."""
    bert = tmp_path / "bert.onnx"
    onnx.save(bert_model(), str(bert))
    r = analyze(bert, "onnx", [tensor_spec("input_ids:INT64:128")])
    assert r["macs_per_sample"] == bert_macs(128, **BERT_DEFAULTS)
    resnet = tmp_path / "resnet.onnx"
    onnx.save(resnet_model(), str(resnet))
    r = analyze(resnet)
    assert r["macs_per_sample"] == resnet18_macs(**RESNET_DEFAULTS)
    assert close(r["macs_per_sample"], 1_814_000_000, 0.01)  # torchvision's published 1.81 GMAC (+ BN)


@pytest.mark.slow
def test_cli_example_model_and_analyze(tmp_path: Path) -> None:
    """``farm example-model --kind bert-tiny`` then ``farm analyze --input ... --json``, as a user runs them."""
    import json
    import subprocess
    import sys

    path = tmp_path / "bert.onnx"
    run = [sys.executable, "-m", "farm"]
    subprocess.run([*run, "example-model", str(path), "--kind", "bert-tiny"], check=True, capture_output=True)
    out = subprocess.run([*run, "analyze", str(path), "--input", "input_ids:INT64:128", "--json"], check=True,
                         capture_output=True, text=True).stdout
    r = json.loads(out)
    assert r["macs_per_sample"] == bert_macs(128, **BERT_DEFAULTS) and r["complete"] is True
    assert r["params"] == 12_683_845
    bad = subprocess.run([*run, "example-model", str(tmp_path / "x.onnx"), "--kind", "bert"], capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "bert-tiny" in bad.stderr and "Traceback" not in bad.stderr


def test_symbolic_fallback_does_not_import_torch(tmp_path: Path) -> None:
    """The BERT graph needs ONNX Runtime's symbolic inference (Range of a computed length); loading it
    must not import torch (onnxruntime.tools/__init__ does, which costs seconds)."""
    import subprocess
    import sys

    p = tmp_path / "bert.onnx"
    onnx.save(bert_model(**BERT), str(p))
    code = ("import sys; from farm.models.analysis import analyze; from farm.models.info import tensor_spec; "
            f"r = analyze({str(p)!r}, 'onnx', [tensor_spec('input_ids:INT64:8')]); "
            "print(r['macs_per_sample'], r['complete'], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out == [str(bert_macs(8, **BERT)), "True", "False"]


@pytest.mark.slow
def test_onnxruntime_optimized_bert(tmp_path: Path) -> None:
    """ONNX Runtime's transformer optimizer fuses the exported encoder into contrib ops (SkipLayerNormalization,
    BiasGelu); their shapes come from ONNX Runtime's symbolic inference and every op is counted."""
    torch = pytest.importorskip("torch")
    from onnxruntime.transformers import optimizer

    from farm.models.torch_architectures import bert_module

    exported = export_onnx(bert_module(**BERT), torch.zeros(1, 16, dtype=torch.long), tmp_path / "bert.onnx",
                           ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}})
    fused = optimizer.optimize_model(str(exported), model_type="bert", num_heads=BERT["heads"],
                                     hidden_size=BERT["hidden"], opt_level=0)
    path = tmp_path / "bert_fused.onnx"
    fused.save_model_to_file(str(path))
    r = analyze(path, "onnx", [tensor_spec("input_ids:INT64:128")])
    assert "SkipLayerNormalization" in r["ops"] and r["complete"] is True
    assert r["macs_per_sample"] == bert_macs(128, **BERT)


def test_packed_contrib_attention(tmp_path: Path) -> None:
    """com.microsoft Attention (packed QKV weights): projection + Q K^T + P V MACs; ONNX Runtime runs it."""
    d, heads, seq = 32, 4, 16
    rng = np.random.RandomState(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (d, 3 * d)), ("bias", (3 * d,)))]
    node = helper.make_node("Attention", ["x", "w", "bias"], ["y"], domain="com.microsoft", num_heads=heads)
    graph = helper.make_graph([node], "a", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", d])], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    p = tmp_path / "attention.onnx"
    onnx.save(model, str(p))
    (y,) = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.zeros((1, seq, d), np.float32)})
    assert y.shape == (1, seq, d)
    r = analyze(p, "onnx", [tensor_spec(f"x:FP32:{seq}x{d}")])
    assert r["macs_per_sample"] == seq * d * 3 * d + seq * seq * (d + d) and r["complete"] is True

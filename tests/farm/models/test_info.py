"""Tests for farm.models.info: format detection, input inference/checking, spec parsing, hashing."""
from __future__ import annotations

import hashlib
import math
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from farm.errors import ModelError, RequestError
from farm.models.examples import build_example
from farm.models.info import (
    ModelInfo,
    detect_format,
    format_input_spec,
    inspect_model,
    sha256_file,
    tensor_spec,
)
from farm.models.torchscript import torchscript_declared_inputs
from schemas import TensorSpec
from schemas.dtypes import DTYPES
from schemas.specs import MAX_INPUT_ELEMENTS


def save_model(path: Path, nodes: list, inputs: list, outputs: list, inits: list | None = None,
               opset: int = 17) -> Path:
    """Save a small ONNX graph without running the checker (tests feed it bad graphs on purpose)."""
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def relu_model(path: Path, dims: list, elem: int = TensorProto.FLOAT, name: str = "x") -> Path:
    return save_model(path, [helper.make_node("Relu", [name], ["y"])],
                      [helper.make_tensor_value_info(name, elem, dims)],
                      [helper.make_tensor_value_info("y", elem, dims)])


def assert_one_line(exc: BaseException, *needles: str) -> None:
    msg = str(exc)
    assert msg and "\n" not in msg and "\r" not in msg, msg
    for n in needles:
        assert n.lower() in msg.lower(), f"{n!r} not in {msg!r}"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    return {k: build_example(k, d / f"{k}.onnx") for k in ("mlp", "convnet", "identity")}


# ------------------------------------------------------------------------------------- detect_format
def test_detect_onnx(models: dict[str, Path]) -> None:
    assert detect_format(models["mlp"]) == "onnx"
    assert detect_format(models["convnet"]) == "onnx"


def test_detect_onnx_by_content_not_extension(models: dict[str, Path], tmp_path: Path) -> None:
    odd = tmp_path / "model.bin"
    odd.write_bytes(models["mlp"].read_bytes())
    assert detect_format(odd) == "onnx"


def test_detect_missing(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as ei:
        detect_format(tmp_path / "nope.onnx")
    assert_one_line(ei.value, "does not exist", "path")


def test_detect_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as ei:
        detect_format(tmp_path)
    assert_one_line(ei.value, "directory")


def test_detect_empty(tmp_path: Path) -> None:
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelError) as ei:
        detect_format(p)
    assert_one_line(ei.value, "empty", "re-export")


def test_detect_text(tmp_path: Path) -> None:
    p = tmp_path / "notes.onnx"
    p.write_text("this is not a model\nsecond line\n")
    with pytest.raises(ModelError) as ei:
        detect_format(p)
    assert_one_line(ei.value, "text file", "ONNX")


def test_detect_png(tmp_path: Path) -> None:
    p = tmp_path / "cat.png"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    with pytest.raises(ModelError) as ei:
        detect_format(p)
    assert_one_line(ei.value, "PNG")


@pytest.mark.parametrize("name", ["noise.onnx", "noise.pt"])
def test_detect_random_binary(tmp_path: Path, name: str) -> None:
    p = tmp_path / name
    p.write_bytes(np.random.RandomState(1).bytes(4096))
    with pytest.raises(ModelError) as ei:
        detect_format(p)
    assert_one_line(ei.value, "not a valid ONNX model")
    if name.endswith(".pt"):
        assert_one_line(ei.value, "TorchScript extension", "torch.jit.save")


def test_detect_onnx_with_long_doc_string(tmp_path: Path) -> None:
    """A model whose first 4 KiB are mostly text is still ONNX (text sniffing comes after parsing)."""
    model = onnx.load(str(relu_model(tmp_path / "r.onnx", ["b", 2])))
    model.doc_string = "A perfectly printable description. " * 400
    p = tmp_path / "doc.onnx"
    onnx.save(model, str(p))
    assert detect_format(p) == "onnx"


@pytest.mark.parametrize("fraction", [0.5, 0.9, 0.99])
def test_detect_truncated_onnx(models: dict[str, Path], tmp_path: Path, fraction: float) -> None:
    data = models["mlp"].read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelError) as ei:
        detect_format(p)
    assert_one_line(ei.value, "not a valid ONNX model", "truncated")


def test_detect_plain_zip(tmp_path: Path) -> None:
    p = tmp_path / "stuff.zip"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(ModelError) as ei:
        detect_format(p)
    assert_one_line(ei.value, "not a TorchScript")


def test_detect_torchscript_and_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    ts = build_example("torchscript-mlp", tmp_path / "m.pt")
    assert detect_format(ts) == "torchscript"
    ckpt = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(3)}, ckpt)
    with pytest.raises(ModelError) as ei:
        detect_format(ckpt)
    assert_one_line(ei.value, "torch.save", "torch.jit.script")


# ------------------------------------------------------------------------------------- inspect (ONNX)
def test_inspect_infers_spec(models: dict[str, Path]) -> None:
    info = inspect_model(models["convnet"])
    assert isinstance(info, ModelInfo)
    assert info.format == "onnx"
    assert info.inputs == [TensorSpec(name="input", dtype="FP32", shape=(3, 32, 32))]
    assert info.outputs == [TensorSpec(name="output", dtype="FP32", shape=(10,))]
    assert info.dynamic_batch is True and info.static_batch is None
    assert info.size_bytes == models["convnet"].stat().st_size
    assert info.sha256 == hashlib.sha256(models["convnet"].read_bytes()).hexdigest()


def test_inspect_static_batch(tmp_path: Path) -> None:
    p = relu_model(tmp_path / "static.onnx", [1, 3, 4, 4])
    info = inspect_model(p)
    assert info.dynamic_batch is False
    assert info.static_batch == 1
    assert info.inputs[0].shape == (3, 4, 4)
    assert any("fixed at 1" in n for n in info.notes)


def test_inspect_dtype_mapping(tmp_path: Path) -> None:
    p = save_model(tmp_path / "ids.onnx", [helper.make_node("Identity", ["ids"], ["out"])],
                   [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", 7])],
                   [helper.make_tensor_value_info("out", TensorProto.INT64, ["n", 7])])
    info = inspect_model(p)
    assert info.inputs == [TensorSpec(name="ids", dtype="INT64", shape=(7,))]


def test_inspect_excludes_initializers_from_inputs(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((4, 2), np.float32), "w")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4]),
              helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 2])]  # old-style: listed as input
    p = save_model(tmp_path / "init.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"])], inputs,
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])], [w])
    info = inspect_model(p)
    assert [s.name for s in info.inputs] == ["x"]
    assert info.outputs[0].shape == (2,)


def test_inspect_dynamic_dim_needs_inputs(tmp_path: Path) -> None:
    p = relu_model(tmp_path / "dyn.onnx", ["batch", 3, "height", "width"], name="image")
    with pytest.raises(ModelError) as ei:
        inspect_model(p)
    assert_one_line(ei.value, "'image'", "height", "--input")
    info = inspect_model(p, given_inputs=[tensor_spec("image:FP32:3x8x8")])
    assert info.inputs[0].shape == (3, 8, 8)
    assert info.outputs[0].shape == (3, 8, 8)  # inferred through the given shape


def test_inspect_given_inputs_match(models: dict[str, Path]) -> None:
    spec = TensorSpec(name="input", dtype="FP32", shape=(3, 32, 32))
    assert inspect_model(models["convnet"], "onnx", [spec]).inputs == [spec]


@pytest.mark.parametrize("text,needles", [
    ("image:FP32:3x32x32", ["not in the model: image", "not given: input"]),
    ("input:INT64:3x32x32", ["dtype is FP32", "given INT64"]),
    ("input:FP32:3x64x64", ["[3,32,32]", "3x64x64"]),
    ("input:FP32:3x32", ["3 per-sample dims", "given 2"]),
])
def test_inspect_given_inputs_mismatch(models: dict[str, Path], text: str, needles: list[str]) -> None:
    with pytest.raises(ModelError) as ei:
        inspect_model(models["convnet"], None, [tensor_spec(text)])
    assert_one_line(ei.value, "do not match", *needles)


def test_inspect_extra_given_input(models: dict[str, Path]) -> None:
    given = [tensor_spec("input:FP32:256"), tensor_spec("mask:FP32:256")]
    with pytest.raises(ModelError) as ei:
        inspect_model(models["mlp"], None, given)
    assert_one_line(ei.value, "not in the model: mask")


def test_inspect_format_mismatch(models: dict[str, Path]) -> None:
    with pytest.raises(ModelError) as ei:
        inspect_model(models["mlp"], "torchscript")
    assert_one_line(ei.value, "content is onnx", "--format onnx")


def test_inspect_checker_failure(tmp_path: Path) -> None:
    p = save_model(tmp_path / "bad.onnx", [helper.make_node("NoSuchOp", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])])
    assert detect_format(p) == "onnx"  # parses fine; only the checker objects
    with pytest.raises(ModelError) as ei:
        inspect_model(p)
    assert_one_line(ei.value, "ONNX checker", "NoSuchOp")


def test_inspect_unsupported_dtype(tmp_path: Path) -> None:
    p = relu_model(tmp_path / "bf16.onnx", ["b", 2], elem=TensorProto.BFLOAT16)
    with pytest.raises(ModelError) as ei:
        inspect_model(p)
    assert_one_line(ei.value, "BFLOAT16", "FP32")


def test_inspect_external_data(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    p = tmp_path / "ext.onnx"
    onnx.save(model, str(p), save_as_external_data=True, location="ext.data", size_threshold=0)
    with pytest.raises(ModelError) as ei:
        inspect_model(p)
    assert_one_line(ei.value, "external data", "save_as_external_data=False")


# -------------------------------------------------------------------------------- inspect (TorchScript)
def test_inspect_torchscript_declared(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    p = build_example("torchscript-convnet", tmp_path / "c.pt")
    assert torchscript_declared_inputs(p) == [TensorSpec(name="input", dtype="FP32", shape=(3, 32, 32))]
    info = inspect_model(p)
    assert info.format == "torchscript"
    assert info.inputs == [TensorSpec(name="input", dtype="FP32", shape=(3, 32, 32))]
    assert info.outputs == [TensorSpec(name="output__0", dtype="FP32", shape=(10,))]
    assert info.dynamic_batch is True


def _plain_scripted(path: Path) -> Path:
    torch = pytest.importorskip("torch")

    class Double(torch.nn.Module):
        def forward(self, x, y):  # noqa: ANN001, ANN201
            return x * 2 + y

    torch.jit.script(Double()).save(str(path))
    return path


def test_inspect_torchscript_needs_inputs(tmp_path: Path) -> None:
    p = _plain_scripted(tmp_path / "plain.pt")
    assert torchscript_declared_inputs(p) is None
    with pytest.raises(ModelError) as ei:
        inspect_model(p)
    assert_one_line(ei.value, "TorchScript models carry no input shapes", "--input")


def test_inspect_torchscript_given_inputs(tmp_path: Path) -> None:
    p = _plain_scripted(tmp_path / "plain.pt")
    given = [tensor_spec("x:FP32:5"), tensor_spec("y:FP32:5")]
    info = inspect_model(p, "torchscript", given)
    assert info.inputs == given
    assert info.outputs == [TensorSpec(name="output__0", dtype="FP32", shape=(5,))]
    with pytest.raises(ModelError) as ei:
        inspect_model(p, None, given[:1])
    assert_one_line(ei.value, "takes 2 inputs", "given 1")
    with pytest.raises(ModelError) as ei:
        inspect_model(p, None, [tensor_spec("x:FP32:5"), tensor_spec("y:FP32:6")])
    assert_one_line(ei.value, "failed on a batch of 1", "x:FP32:5, y:FP32:6")


# ------------------------------------------------------------------------------------ parse / sha256
@pytest.mark.parametrize("text,expected", [
    ("input:FP32:3x224x224", TensorSpec(name="input", dtype="FP32", shape=(3, 224, 224))),
    ("x:fp32:1,28,28", TensorSpec(name="x", dtype="FP32", shape=(1, 28, 28))),
    ("x:float16:[2, 3]", TensorSpec(name="x", dtype="FP16", shape=(2, 3))),
    ("ids:int64:128", TensorSpec(name="ids", dtype="INT64", shape=(128,))),
    ("input_1:0:FP32:8", TensorSpec(name="input_1:0", dtype="FP32", shape=(8,))),
    ("x:3x4", TensorSpec(name="x", dtype="FP32", shape=(3, 4))),
    ("flag:BOOL:", TensorSpec(name="flag", dtype="BOOL", shape=())),
])
def test_tensor_spec(text: str, expected: TensorSpec) -> None:
    assert tensor_spec(text) == expected


@pytest.mark.parametrize("text", ["x", "x:FP32:3xa", "x:FP32:0x3", "x:FP32:-1x3", ":FP32:3", "x:FP32:3x"])
def test_tensor_spec_bad(text: str) -> None:
    with pytest.raises(RequestError) as ei:
        tensor_spec(text)
    assert_one_line(ei.value, "NAME:DTYPE:SHAPE")


@settings(max_examples=60, deadline=None)
@given(name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:]{0,20}", fullmatch=True),
       dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(1, 4096), max_size=5))
def test_parse_format_roundtrip(name: str, dtype: str, shape: list[int]) -> None:
    assume(math.prod(shape) <= MAX_INPUT_ELEMENTS)  # larger samples are refused (test_input_limits)
    spec = TensorSpec(name=name, dtype=dtype, shape=tuple(shape))
    assert tensor_spec(format_input_spec(spec)) == spec


def test_sha256_file_streams(tmp_path: Path) -> None:
    data = np.random.RandomState(0).bytes(3 * (1 << 20) + 17)
    p = tmp_path / "blob"
    p.write_bytes(data)
    assert sha256_file(p) == hashlib.sha256(data).hexdigest()
    assert sha256_file(p, chunk_bytes=1000) == hashlib.sha256(data).hexdigest()

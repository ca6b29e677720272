"""Tests for farm.models.examples and farm.models.torchscript: every example builds, checks, runs and inspects."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from farm.errors import RequestError
from farm.models.examples import (
    COMPUTE_DIM,
    COMPUTE_ROWS,
    EXAMPLE_KINDS,
    LLM_KINDS,
    ONNX_KINDS,
    TORCHSCRIPT_KINDS,
    build_example,
    calibrate_gflops,
    compute_layer_flops,
    compute_layers,
    main,
)
from farm.models.info import inspect_model
from schemas import TensorSpec

# Small options keep the suite fast and light: compute ~0.5 ms, memory 8 MiB per sample.
OPTIONS: dict[str, dict[str, Any]] = {
    "compute": {"ms": 0.5}, "memory": {"mb": 8}, "resnet18": {"width": 8, "classes": 10, "image": 32},
    "bert-tiny": {"vocab": 500, "hidden": 32, "layers": 1, "heads": 2, "ffn": 64, "max_positions": 128},
}
BASIC_KINDS = ("mlp", "convnet", "identity", "compute", "memory")  # input ``input`` FP32, fixed shapes
EXPECTED: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {  # per-sample (input, output) shapes
    "mlp": ((256,), (10,)),
    "convnet": ((3, 32, 32), (10,)),
    "identity": ((4,), (4,)),
    "compute": ((COMPUTE_ROWS, COMPUTE_DIM), (COMPUTE_ROWS, COMPUTE_DIM)),
    "memory": ((16,), (16,)),
}


def session(path: Path, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def test_kinds_tuple() -> None:
    assert set(EXAMPLE_KINDS) == set(ONNX_KINDS) | set(TORCHSCRIPT_KINDS) | set(LLM_KINDS)
    real = {"bert-tiny", "resnet18", "torchscript-bert-tiny", "torchscript-resnet18"}
    assert {*BASIC_KINDS, *real} <= set(EXAMPLE_KINDS)


@pytest.mark.parametrize("kind", BASIC_KINDS)
def test_onnx_example(kind: str, tmp_path: Path) -> None:
    path = build_example(kind, tmp_path / f"{kind}.onnx", **OPTIONS.get(kind, {}))
    assert path.exists() and path.stat().st_size > 0
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    in_shape, out_shape = EXPECTED[kind]
    sess = session(path)
    for batch in (1, 4):
        x = np.random.RandomState(batch).standard_normal((batch, *in_shape)).astype(np.float32)
        (y,) = sess.run(None, {"input": x})
        assert y.shape == (batch, *out_shape)
        assert np.isfinite(y).all()
    info = inspect_model(path)
    assert info.inputs == [TensorSpec(name="input", dtype="FP32", shape=in_shape)]
    assert info.outputs == [TensorSpec(name="output", dtype="FP32", shape=out_shape)]
    assert info.dynamic_batch is True


def test_identity_returns_input(tmp_path: Path) -> None:
    path = build_example("identity", tmp_path / "id.onnx", shape=(2, 3))
    x = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    (y,) = session(path).run(None, {"input": x})
    np.testing.assert_array_equal(x, y)
    assert inspect_model(path).inputs[0].shape == (2, 3)


def test_memory_model_computes_sum_of_squares(tmp_path: Path) -> None:
    path = build_example("memory", tmp_path / "mem.onnx", mb=1)
    n = (1 << 20) // (4 * 16)
    x = np.full((2, 16), 0.5, dtype=np.float32)
    (y,) = session(path).run(None, {"input": x})
    np.testing.assert_allclose(y, np.full((2, 16), 0.25 * n), rtol=1e-4)
    assert path.stat().st_size < 4096  # the memory is needed at run time, not shipped in the file


_RSS_PROBE = textwrap.dedent("""
    import sys, numpy as np, onnxruntime as ort

    def hwm():  # VmHWM starts afresh at exec (ru_maxrss would inherit the parent's peak)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    so = ort.SessionOptions(); so.intra_op_num_threads = 1
    sess = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
    x = np.ones((1, 16), np.float32)
    before = hwm()
    sess.run(None, {"input": x})
    print(hwm() - before)
""")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_memory_model_really_needs_the_memory(tmp_path: Path) -> None:
    """Peak RSS of a fresh onnxruntime process grows by at least ``mb`` MiB during one inference."""
    path = build_example("memory", tmp_path / "mem.onnx", mb=32)
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(path)], capture_output=True, text=True,
                         timeout=120, check=True)
    grown = int(out.stdout.strip())
    print(f"memory model mb=32: peak RSS grew by {grown / 2**20:.1f} MiB")
    assert grown >= 32 * (1 << 20)


def test_builds_are_deterministic(tmp_path: Path) -> None:
    for kind in ONNX_KINDS:
        a = build_example(kind, tmp_path / f"a_{kind}.onnx", **OPTIONS.get(kind, {}))
        b = build_example(kind, tmp_path / f"b_{kind}.onnx", **OPTIONS.get(kind, {}))
        assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest(), kind


def test_build_into_directory(tmp_path: Path) -> None:
    path = build_example("mlp", tmp_path)
    assert path == tmp_path / "mlp.onnx" and path.exists()


def test_unknown_kind_and_bad_option(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="unknown example model 'resnet'"):
        build_example("resnet", tmp_path / "x.onnx")
    with pytest.raises(RequestError, match="bad option"):
        build_example("mlp", tmp_path / "x.onnx", colour="red")
    with pytest.raises(RequestError, match="ms > 0"):
        build_example("compute", tmp_path / "x.onnx", ms=0)


def test_compute_sizing() -> None:
    assert compute_layer_flops() == 2 * COMPUTE_ROWS * COMPUTE_DIM * COMPUTE_DIM
    assert compute_layers(0.001) == 1
    five, ten = compute_layers(5.0), compute_layers(10.0)
    assert abs(ten - 2 * five) <= 1
    assert compute_layers(5.0, gflops=50.0) < five


def test_calibrated_compute_model(tmp_path: Path) -> None:
    gflops = calibrate_gflops(seconds=0.1)
    print(f"single-threaded onnxruntime MatMul: {gflops:.1f} GFLOP/s")
    assert gflops > 0
    path = build_example("compute", tmp_path / "cal.onnx", ms=1.0, calibrate=True)
    assert inspect_model(path).inputs[0].shape == (COMPUTE_ROWS, COMPUTE_DIM)


def test_compute_layers_in_file(tmp_path: Path) -> None:
    path = build_example("compute", tmp_path / "c.onnx", ms=2.0)
    model = onnx.load(str(path))
    assert [n.op_type for n in model.graph.node] == ["MatMul"] * compute_layers(2.0)
    assert len(model.graph.initializer) == 1  # one shared weight keeps the file small


def test_compute_time_scales_with_ms(tmp_path: Path) -> None:
    """Prints the per-sample time; asserts only that 4x the work takes clearly longer."""
    times = {}
    for ms in (1.0, 4.0):
        sess = session(build_example("compute", tmp_path / f"c{ms}.onnx", ms=ms))
        x = np.ones((1, COMPUTE_ROWS, COMPUTE_DIM), dtype=np.float32)
        sess.run(None, {"input": x})
        runs = []
        for _ in range(20):
            t0 = time.perf_counter()
            sess.run(None, {"input": x})
            runs.append(time.perf_counter() - t0)
        times[ms] = min(runs) * 1e3  # the minimum is robust to other load on the machine
    print(f"compute model per-sample time (min of 20), 1 thread: {times}")
    assert times[4.0] > 1.5 * times[1.0]


def test_main_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["identity", str(tmp_path / "i.onnx"), "shape=2x2"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "i.onnx")
    assert inspect_model(tmp_path / "i.onnx").inputs[0].shape == (2, 2)
    assert main([]) == 2


@pytest.mark.parametrize("kind", ["torchscript-mlp", "torchscript-convnet"])
def test_torchscript_example(kind: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = build_example(kind, tmp_path / f"{kind}.pt")
    onnx_path = build_example(kind.split("-", 1)[1], tmp_path / f"{kind}.onnx")
    module = torch.jit.load(str(path))
    info = inspect_model(path)
    assert info.format == "torchscript"
    assert list(module.farm_inputs) == [f"input:FP32:{'x'.join(map(str, info.inputs[0].shape))}"]
    sess = session(onnx_path)
    for batch in (1, 4):
        x = np.random.RandomState(batch).standard_normal((batch, *info.inputs[0].shape)).astype(np.float32)
        with torch.no_grad():
            y = module(torch.from_numpy(x)).numpy()
        (y_onnx,) = sess.run(None, {"input": x})
        assert y.shape == (batch, 10)
        np.testing.assert_allclose(y, y_onnx, rtol=1e-4, atol=1e-5)  # same weights, same function


def test_torchscript_example_rejects_options(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with pytest.raises(RequestError, match="takes no options"):
        build_example("torchscript-mlp", tmp_path / "m.pt", ms=3)


@pytest.mark.parametrize("kind", ["bert-tiny", "resnet18"])
def test_architecture_examples(kind: str, tmp_path: Path) -> None:
    """The real-architecture kinds in both formats: declared inputs, same outputs (same weights)."""
    torch = pytest.importorskip("torch")
    opts = OPTIONS[kind]
    onnx_path = build_example(kind, tmp_path, **opts)
    ts_path = build_example(f"torchscript-{kind}", tmp_path, **opts)
    assert onnx_path.name == f"{kind}.onnx" and ts_path.name == f"torchscript-{kind}.pt"
    ts_info = inspect_model(ts_path)  # inputs declared in the file
    if kind == "bert-tiny":
        assert ts_info.inputs == [TensorSpec(name="input_ids", dtype="INT64", shape=(128,))]
        x: np.ndarray = np.random.RandomState(0).randint(0, opts["vocab"], (3, 20)).astype(np.int64)
        feed = {"input_ids": x}
    else:
        assert inspect_model(onnx_path).inputs == ts_info.inputs == [TensorSpec(name="input", dtype="FP32",
                                                                                shape=(3, 32, 32))]
        x = np.random.RandomState(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
        feed = {"input": x}
    (y_onnx,) = session(onnx_path).run(None, feed)
    with torch.no_grad():
        y = torch.jit.load(str(ts_path))(torch.from_numpy(x)).numpy()
    assert y.shape == y_onnx.shape == (3, opts["hidden"] if kind == "bert-tiny" else opts["classes"])
    np.testing.assert_allclose(y, y_onnx, rtol=1e-4, atol=1e-4)
    with pytest.raises(RequestError, match="bad option"):
        build_example(kind, tmp_path / "bad.onnx", depth=3)

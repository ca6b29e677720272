"""The engine backends in-process: ONNX Runtime always, TorchScript when torch is installed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from farm.errors import ModelError, ServerError
from schemas.dtypes import parse_input_spec
from workers.engines.backends import make_backend
from workers.engines.base import InputError, IOSpec


def test_onnxruntime_specs_and_infer(mlp_onnx: Path, identity_onnx: Path) -> None:
    import onnxruntime as ort

    with make_backend("onnxruntime") as b:
        b.load(mlp_onnx, "cpu", threads=1)
        assert b.inputs() == [IOSpec("x", "FP32", (-1, 16))]
        assert b.outputs() == [IOSpec("y", "FP32", (-1, 4))]
        x = np.random.default_rng(0).standard_normal((7, 16)).astype(np.float32)
        want = ort.InferenceSession(str(mlp_onnx), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(b.infer({"x": x})["y"], want, rtol=1e-6)
    with make_backend("onnxruntime") as b:
        b.load(identity_onnx, "cpu", threads=0)
        assert [s.datatype for s in b.inputs()] == ["FP32", "INT64"]
        ids = np.frombuffer(np.arange(6, dtype=np.int64).tobytes(), np.int64).reshape(2, 3)  # read-only
        out = b.infer({"x": np.zeros((2, 4), np.float32), "ids": ids}, outputs=["ids_out"])
        assert list(out) == ["ids_out"]
        np.testing.assert_array_equal(out["ids_out"], ids)


def test_onnxruntime_bad_input_is_input_error(mlp_onnx: Path) -> None:
    b = make_backend("onnxruntime")
    b.load(mlp_onnx, "cpu", threads=1)
    with pytest.raises(InputError):
        b.infer({"x": np.zeros((1, 15), np.float32)})
    b.close()


def test_onnxruntime_gpu_without_cuda_says_so(mlp_onnx: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(ServerError, match="CUDAExecutionProvider"):
        make_backend("onnxruntime").load(mlp_onnx, "gpu:a100", threads=0)


def test_onnxruntime_bad_file_is_model_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk")
    with pytest.raises(ModelError, match="cannot load"):
        make_backend("onnxruntime").load(bad, "cpu", 0)
    with pytest.raises(ModelError, match="does not exist"):
        make_backend("onnxruntime").load(tmp_path / "none.onnx", "cpu", 0)


def test_make_backend_unknown_engines() -> None:
    with pytest.raises(ServerError, match="'triton' is served by its own server"):
        make_backend("triton")
    with pytest.raises(ServerError, match="unknown"):
        make_backend("tensorrt")
    with pytest.raises(ServerError, match="device"):
        make_backend("onnxruntime").load(Path("x.onnx"), "tpu", 0)


def test_parse_input_spec() -> None:
    assert IOSpec(*parse_input_spec("x:fp32:-1x3x8")) == IOSpec("x", "FP32", (-1, 3, 8))
    assert IOSpec(*parse_input_spec("a:b:INT64:4")) == IOSpec("a:b", "INT64", (4,))
    assert IOSpec(*parse_input_spec("x:UINT16:-1")) == IOSpec("x", "UINT16", (-1,))
    for bad in ("x", "x:FP32:1xq", "x:FP32:0", "x:FP32:-2"):
        with pytest.raises(ValueError):
            parse_input_spec(bad)


@pytest.fixture(scope="module")
def torchscript_mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    path = tmp_path_factory.mktemp("ts") / "mlp.pt"
    torch.jit.script(net).save(str(path))
    return path, net


def test_torchscript_backend_matches_eager(torchscript_mlp) -> None:
    torch = pytest.importorskip("torch")
    path, net = torchscript_mlp
    x = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    with make_backend("torchscript") as b:
        b.load(path, "cpu", threads=1)
        assert [s.name for s in b.inputs()] == ["input"]
        assert b.inputs()[0].shape is None  # TorchScript carries no shapes unless declared
        ro = np.frombuffer(x.tobytes(), np.float32).reshape(5, 16)  # read-only, like request bytes
        got = b.infer({"input": ro})["output__0"]
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_torchscript_declared_inputs_discover_outputs(torchscript_mlp) -> None:
    pytest.importorskip("torch")
    path, _ = torchscript_mlp
    b = make_backend("torchscript")
    b.declare_inputs([IOSpec("input", "FP32", (-1, 16))])
    b.load(path, "cpu", threads=0)
    assert b.inputs() == [IOSpec("input", "FP32", (-1, 16))]
    assert b.outputs() == [IOSpec("output__0", "FP32", (-1, 4))]
    with pytest.raises(InputError):
        b.infer({"input": np.zeros((2, 5), np.float32)})
    b.close()


def test_torchscript_bad_file_and_gpu(tmp_path: Path, torchscript_mlp) -> None:
    torch = pytest.importorskip("torch")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"junk")
    with pytest.raises(ModelError, match="torch.jit.load"):
        make_backend("torchscript").load(bad, "cpu", 0)
    if not torch.cuda.is_available():
        with pytest.raises(ServerError, match="CUDA"):
            make_backend("torchscript").load(torchscript_mlp[0], "gpu", 0)


def test_torchscript_served(torchscript_mlp, start_server) -> None:
    torch = pytest.importorskip("torch")
    import tritonclient.grpc as tc

    path, net = torchscript_mlp
    with start_server(path, "--format", "torchscript", "--engine", "torchscript",
                      "--input", "input:FP32:-1x16") as s:
        c = tc.InferenceServerClient(s.url)
        md = c.get_model_metadata("model")
        assert md.platform == "pytorch_libtorch"
        assert [(o.name, list(o.shape)) for o in md.outputs] == [("output__0", [-1, 4])]
        x = np.ones((3, 16), np.float32)
        i = tc.InferInput("input", [3, 16], "FP32")
        i.set_data_from_numpy(x)
        res = c.infer("model", [i])
        with torch.no_grad():
            want = net(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(res.as_numpy("output__0"), want, rtol=1e-5, atol=1e-6)
        assert res.get_response().parameters["farm_compute_ns"].int64_param > 0
        assert s.stop() == 0


def test_format_engine_mismatch_exits_2(mlp_onnx: Path, serve_cmd, repo_root: Path) -> None:
    import subprocess

    r = subprocess.run(serve_cmd(mlp_onnx, "--engine", "torchscript"), cwd=repo_root,
                       capture_output=True, timeout=120)
    assert r.returncode == 2
    assert b"--engine onnxruntime" in r.stderr

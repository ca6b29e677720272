"""OpenVINO as a third CPU engine: the backend's outputs equal ONNX Runtime's on the same ONNX files,
farm's server serves it (tritonclient), edge runs and served jobs use it, and the rules refuse what it
cannot load."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tc

from farm.errors import ServerError
from tests.helpers import FAST, farm
from workers.engines.backends import make_backend

pytest.importorskip("openvino", reason="openvino is not installed (pip install '.[openvino]')")


def _feeds(batch: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(batch)
    return {"mlp": {"x": rng.standard_normal((batch, 16)).astype(np.float32)},
            "identity": {"x": rng.standard_normal((batch, 4)).astype(np.float32),
                         "ids": rng.integers(0, 1000, (batch, 3)).astype(np.int64)}}


@pytest.mark.parametrize("batch", [1, 5])
def test_outputs_equal_onnxruntime(mlp_onnx: Path, identity_onnx: Path, batch: int) -> None:
    for name, path in (("mlp", mlp_onnx), ("identity", identity_onnx)):
        feed = _feeds(batch)[name]
        with make_backend("openvino") as ov, make_backend("onnxruntime") as ort:
            ov.load(path, "cpu", 1)
            ort.load(path, "cpu", 1)
            assert ov.inputs() == ort.inputs() and ov.outputs() == ort.outputs()
            got, want = ov.infer(feed), ort.infer(feed)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_openvino_refuses_gpu_and_missing_files(mlp_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="runs on cpu"):
        make_backend("openvino").load(mlp_onnx, "gpu:t4", 0)
    with pytest.raises(Exception, match="does not exist"):
        make_backend("openvino").load(tmp_path / "none.onnx", "cpu", 0)


def test_server_serves_openvino_like_onnxruntime(mlp_onnx: Path, start_server) -> None:
    feed = _feeds(3)["mlp"]["x"]
    with make_backend("onnxruntime") as ort:
        ort.load(mlp_onnx, "cpu", 1)
        want = ort.infer({"x": feed})["y"]
    with start_server(mlp_onnx, "--engine", "openvino", "--threads", "1") as s:
        c = tc.InferenceServerClient(s.url)
        assert c.get_model_metadata("model").platform == "openvino"
        assert c.get_model_config("model").config.backend == "openvino"
        x = tc.InferInput("x", [3, 16], "FP32")
        x.set_data_from_numpy(feed)
        np.testing.assert_allclose(c.infer("model", [x]).as_numpy("y"), want, rtol=1e-4, atol=1e-5)


def test_server_refuses_a_format_openvino_cannot_load(mlp_onnx: Path, serve_cmd, repo_root: Path) -> None:
    import subprocess

    proc = subprocess.run(serve_cmd(mlp_onnx, "--engine", "openvino", "--format", "torchscript"), cwd=repo_root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cannot load torchscript" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_served_and_edge_jobs_run_on_openvino(mlp_onnx: Path) -> None:
    farm("submit", str(mlp_onnx), "--engine", "onnxruntime", "--engine", "openvino", "--edge", "cpus=1,memory=1g",
         "--batch-sizes", "2", *FAST)
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    got = sorted((r["engine"], r["edge_profile"] is not None, r["status"]) for r in rows)
    assert got == [("onnxruntime", False, "succeeded"), ("onnxruntime", True, "succeeded"),
                   ("openvino", False, "succeeded"), ("openvino", True, "succeeded")], rows
    assert all(r["throughput_infer_per_s"] > 0 for r in rows)

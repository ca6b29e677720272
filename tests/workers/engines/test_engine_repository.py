"""farm's server answers Triton's tools as Triton would: ModelConfig (max_batch_size and per-sample dims
for a dynamic batch axis, 0 and full dims otherwise), RepositoryIndex, and ``farm serve m.onnx`` naming
the model ``m``. Real ``farm serve`` subprocesses, queried with tritonclient (and perf_analyzer where it
is installed)."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tc

from tests.workers.engines.conftest import _save, running_command
from workers.engines.triton import DEFAULT_MAX_BATCH


@contextmanager
def farm_serve(model: Path, *args: str) -> Iterator[str]:
    """``farm serve MODEL --port 0 ARGS`` as a subprocess; yields its HOST:PORT, always stops it."""
    with running_command([sys.executable, "-m", "farm", "serve", str(model), "--port", "0", "--threads", "1",
                          *args]) as server:
        yield server.url


def build_static(path: Path) -> Path:
    """x: FP32 [2, 4] -> y = Relu(x): a model without a batch axis."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "static",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return _save(m, path)


@pytest.fixture(scope="module")
def mlp_serve(mlp_onnx: Path) -> Iterator[str]:
    with farm_serve(mlp_onnx) as url:
        yield url


def test_farm_serve_names_the_model_after_the_file(mlp_serve: str) -> None:
    c = tc.InferenceServerClient(mlp_serve)
    assert c.is_model_ready("mlp")
    assert c.get_model_metadata("mlp").name == "mlp"
    assert not c.is_model_ready("model")


def test_repository_index_lists_the_model_ready(mlp_serve: str) -> None:
    idx = tc.InferenceServerClient(mlp_serve).get_model_repository_index()
    assert [(m.name, m.version, m.state) for m in idx.models] == [("mlp", "1", "READY")]


def test_dynamic_batch_model_config_has_max_batch_size_and_sample_dims(mlp_serve: str) -> None:
    cfg = tc.InferenceServerClient(mlp_serve).get_model_config("mlp").config
    assert cfg.name == "mlp" and cfg.backend == "onnxruntime"
    assert cfg.max_batch_size == DEFAULT_MAX_BATCH
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("x", [16])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("y", [4])]


def test_static_model_config_has_zero_max_batch_and_full_dims(tmp_path: Path) -> None:
    model = build_static(tmp_path / "fixed.onnx")
    with farm_serve(model, "--model-name", "custom") as url:
        c = tc.InferenceServerClient(url)
        cfg = c.get_model_config("custom").config
        assert cfg.max_batch_size == 0
        assert [(i.name, list(i.dims)) for i in cfg.input] == [("x", [2, 4])]
        assert [(o.name, list(o.dims)) for o in cfg.output] == [("y", [2, 4])]
        assert [m.name for m in c.get_model_repository_index().models] == ["custom"]
        x = tc.InferInput("x", [2, 4], "FP32")
        x.set_data_from_numpy(np.full((2, 4), -1.0, np.float32))
        assert (c.infer("custom", [x]).as_numpy("y") == 0).all()


def test_perf_analyzer_batches_against_farm_serve(mlp_serve: str) -> None:
    """NVIDIA's perf_analyzer (installed by scripts/test: ``python3 -m workers.loadgen.perf_analyzer
    --install``) reads the ModelConfig and sends batches of 4 to farm's server."""
    from workers.loadgen.perf_analyzer import tool as pa

    why = pa.missing()
    if why is not None:
        pytest.skip(why)
    proc = subprocess.run([str(pa.binary()), "-m", "mlp", "-u", mlp_serve, "-i", "grpc", "-b", "4",
                           "--concurrency-range", "1", "--measurement-interval", "500",
                           # what it sends is checked here, not how steady the host is: report after 3 windows
                           "--stability-percentage", str(pa.ALWAYS_STABLE_PCT), "--max-trials", "3"],
                          capture_output=True, text=True, timeout=120, env=pa.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Batch size: 4" in proc.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _infer_ones(c: tc.InferenceServerClient, name: str) -> np.ndarray:
    x = tc.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    return c.infer(name, [x]).as_numpy("y")


def test_repository_unload_and_load_as_model_analyzer_drives_them(mlp_onnx: Path) -> None:
    """RepositoryModelUnload makes the model unavailable (not ready, UNAVAILABLE on infer, UNAVAILABLE in
    the index); RepositoryModelLoad brings it back, and with a config (JSON, as Model Analyzer sends)
    reloads it with that config's instance count and dynamic batching."""
    import json

    from google.protobuf import json_format
    from tritonclient.utils import InferenceServerException

    with farm_serve(mlp_onnx, "--metrics-port", "-1") as url:
        c = tc.InferenceServerClient(url)
        assert "model_repository" in c.get_server_metadata().extensions
        before = _infer_ones(c, "mlp")
        c.unload_model("mlp")
        assert not c.is_model_ready("mlp")
        assert [(m.name, m.state) for m in c.get_model_repository_index().models] == [("mlp", "UNAVAILABLE")]
        with pytest.raises(InferenceServerException, match="not loaded") as err:
            _infer_ones(c, "mlp")
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        c.load_model("mlp")
        assert c.is_model_ready("mlp")
        np.testing.assert_allclose(_infer_ones(c, "mlp"), before, rtol=1e-6)

        cfg = json.loads(json_format.MessageToJson(c.get_model_config("mlp").config))
        assert cfg["instanceGroup"][0]["count"] == 1 and "dynamicBatching" not in cfg
        cfg["instanceGroup"][0]["count"] = 2
        cfg["dynamicBatching"] = {"maxQueueDelayMicroseconds": "500"}
        c.load_model("mlp", config=json.dumps(cfg))
        now = c.get_model_config("mlp").config
        assert now.instance_group[0].count == 2
        assert now.dynamic_batching.max_queue_delay_microseconds == 500
        np.testing.assert_allclose(_infer_ones(c, "mlp"), before, rtol=1e-6)

        with pytest.raises(InferenceServerException, match="backend 'pytorch'"):
            c.load_model("mlp", config=json.dumps({**cfg, "backend": "pytorch"}))
        assert c.get_model_config("mlp").config.instance_group[0].count == 2  # a refused load keeps the model
        with pytest.raises(InferenceServerException, match="no model 'other'"):
            c.load_model("other")


def test_farm_serve_exports_triton_style_metrics(mlp_onnx: Path) -> None:
    """``/metrics`` carries Triton's per-model counters (Model Analyzer and perf_analyzer read it)."""
    import urllib.request

    port = _free_port()
    with farm_serve(mlp_onnx, "--metrics-port", str(port)) as url:
        c = tc.InferenceServerClient(url)
        for _ in range(3):
            _infer_ones(c, "mlp")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines['nv_inference_request_success{model="mlp",version="1"}']) == 3
    assert float(lines['nv_inference_count{model="mlp",version="1"}']) == 3
    assert float(lines['nv_inference_compute_infer_duration_us{model="mlp",version="1"}']) > 0
    assert float(lines["nv_cpu_memory_total_bytes"]) > 0

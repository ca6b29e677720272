"""The Triton adapter: repository/config generation, command lines, and attach (against farm's server,
which speaks the same protocol; no Triton image exists here)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from farm.errors import ServerError
from workers.engines.base import IOSpec
from workers.engines.triton import (
    attach,
    build_repository,
    docker_run_kwargs,
    model_config,
    onnx_io,
    tritonserver_command,
)


def _read_config(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def test_onnx_repository_layout_and_config(tmp_path: Path, mlp_onnx: Path) -> None:
    repo = build_repository(tmp_path / "repo", mlp_onnx, "onnx", "mlp", instances=2, threads=3)
    assert (repo / "mlp" / "1" / "model.onnx").read_bytes() == mlp_onnx.read_bytes()
    cfg = _read_config(repo / "mlp" / "config.pbtxt")
    assert cfg.name == "mlp" and cfg.backend == "onnxruntime"
    assert cfg.max_batch_size == 64  # dynamic first dim -> batching on, dims without batch
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("x", mc.TYPE_FP32, [16])]
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [("y", mc.TYPE_FP32, [4])]
    assert len(cfg.instance_group) == 1
    assert cfg.instance_group[0].count == 2 and cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert cfg.parameters["intra_op_thread_count"].string_value == "3"
    # building again over the same repo replaces the file instead of failing
    build_repository(tmp_path / "repo", mlp_onnx, "onnx", "mlp")
    assert _read_config(repo / "mlp" / "config.pbtxt").instance_group[0].count == 1


def test_job_serving_dimensions_reach_config_pbtxt(tmp_path: Path, mlp_onnx: Path) -> None:
    """A job's instances, threads and dynamic batching land in the Triton repository's config.pbtxt."""
    from scheduler.expand import ModelRef, expand
    from schemas import ProfileRequest, TensorSpec
    from workers.serving.triton import prepare_repository

    ref = ModelRef(sha256="d" * 64, format="onnx", filename="mlp.onnx", inputs=(TensorSpec(name="x", shape=(16,)),))
    req = ProfileRequest(model="mlp.onnx", engines=["triton"], instances=[2], threads=[1],
                         max_queue_delay_us=[0, 500], measurement={"preferred_batch_size": 8})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FARM_HOME", str(tmp_path))
        from farm.settings import get_settings

        get_settings.cache_clear()
        repos = [prepare_repository(job, mlp_onnx) for job in expand(req, "r", ref).jobs]
        get_settings.cache_clear()
    assert len(set(repos)) == 2  # one repository per serving configuration
    cfgs = [_read_config(r / "model" / "config.pbtxt") for r in repos]
    assert sorted(c.dynamic_batching.max_queue_delay_microseconds for c in cfgs) == [0, 500]
    assert all(c.HasField("dynamic_batching") and list(c.dynamic_batching.preferred_batch_size) == [8] for c in cfgs)
    assert all(c.instance_group[0].count == 2 and c.parameters["intra_op_thread_count"].string_value == "1"
               for c in cfgs)
    fixed = [IOSpec("x", "FP32", (1, 4))]
    with pytest.raises(ServerError, match="dynamic batch dimension"):
        model_config("m", "onnx", fixed, fixed, max_queue_delay_us=100)
    assert not model_config("m", "onnx", *onnx_io(mlp_onnx)).HasField("dynamic_batching")


def test_gpu_config_and_fixed_batch(tmp_path: Path, identity_onnx: Path) -> None:
    ins, outs = onnx_io(identity_onnx)
    assert ins == [IOSpec("x", "FP32", (-1, 4)), IOSpec("ids", "INT64", (-1, 3))]
    cfg = model_config("m", "onnx", ins, outs, max_batch_size=0, device="gpu:a100")
    assert cfg.max_batch_size == 0
    assert [list(i.dims) for i in cfg.input] == [[-1, 4], [-1, 3]]
    assert cfg.input[1].data_type == mc.TYPE_INT64
    assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert list(cfg.instance_group[0].gpus) == [0]
    fixed = [IOSpec("x", "FP32", (1, 4))]
    with pytest.raises(ServerError, match="dynamic first dimension"):
        model_config("m", "onnx", fixed, fixed, max_batch_size=8)
    assert model_config("m", "onnx", fixed, fixed).max_batch_size == 0


def test_torchscript_repository(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(6, 2))
    pt = tmp_path / "net.pt"
    torch.jit.script(net).save(str(pt))
    with pytest.raises(ServerError, match="inputs"):
        build_repository(tmp_path / "repo", pt, "torchscript")
    repo = build_repository(tmp_path / "repo", pt, "torchscript",
                            inputs=[IOSpec("input", "FP32", (-1, 6))], device="gpu", threads=2)
    assert (repo / "model" / "1" / "model.pt").is_file()
    cfg = _read_config(repo / "model" / "config.pbtxt")
    assert cfg.backend == "pytorch" and cfg.max_batch_size == 64
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("output__0", [2])]
    assert cfg.parameters["INTRA_OP_THREAD_COUNT"].string_value == "2"


def test_command_and_docker_args(tmp_path: Path) -> None:
    cmd = tritonserver_command("/models", 8001)
    assert cmd[0] == "tritonserver"
    assert "--model-repository=/models" in cmd and "--grpc-port=8001" in cmd
    assert "--allow-http=false" in cmd
    kw = docker_run_kwargs(tmp_path, 41234)
    assert kw["ports"] == {"8001/tcp": ("127.0.0.1", 41234)}
    assert kw["volumes"][str(tmp_path.resolve())] == {"bind": "/models", "mode": "ro"}
    assert kw["command"] == cmd and "device_requests" not in kw
    gpu = docker_run_kwargs(tmp_path, 41234, device="gpu:a100", gpu_ids=["GPU-123"])
    assert gpu["device_requests"][0]["DeviceIDs"] == ["GPU-123"]


def test_attach_to_a_kserve_server(mlp_server) -> None:
    import tritonclient.grpc as tc

    srv = attach(mlp_server.url, "model", timeout_s=30)
    assert srv.server_name == "farm" and srv.platform == "onnxruntime_onnx"
    assert srv.inputs == [IOSpec("x", "FP32", (-1, 16))] and srv.port == mlp_server.port
    # the same KServe v2 client drives it
    c = tc.InferenceServerClient(srv.url)
    i = tc.InferInput(srv.inputs[0].name, [2, 16], srv.inputs[0].datatype)
    i.set_data_from_numpy(np.zeros((2, 16), np.float32))
    assert c.infer(srv.model_name, [i]).as_numpy(srv.outputs[0].name).shape == (2, 4)


def test_attach_timeout_is_server_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerError, match="not ready"):
        attach(f"127.0.0.1:{port}", "model", timeout_s=0.3)

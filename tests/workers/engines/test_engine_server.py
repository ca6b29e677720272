"""The built-in KServe v2 server, run as a real subprocess and driven with tritonclient."""
from __future__ import annotations

import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from workers.engines.ready import wait_ready


def _infer(client: tc.InferenceServerClient, model: str, **arrays: np.ndarray) -> tc.InferResult:
    inputs = []
    for name, arr in arrays.items():
        dt = {np.float32: "FP32", np.int64: "INT64", np.float64: "FP64"}[arr.dtype.type]
        i = tc.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    return client.infer(model, inputs)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def test_ready_and_metadata(mlp_server) -> None:
    wait_ready(mlp_server.url, "model", timeout_s=30)
    c = tc.InferenceServerClient(mlp_server.url)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("model")
    assert c.is_model_ready("model", "1")
    assert not c.is_model_ready("other")
    assert c.get_server_metadata().name == "farm"
    md = c.get_model_metadata("model")
    assert md.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [("x", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] == [("y", "FP32", [-1, 4])]
    with pytest.raises(InferenceServerException, match="unknown model"):
        c.get_model_metadata("nope")


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_outputs_match_inprocess_onnxruntime(mlp_server, mlp_onnx: Path, batch: int) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    want = ort.InferenceSession(str(mlp_onnx), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    res = _infer(tc.InferenceServerClient(mlp_server.url), "model", x=x)
    got = res.as_numpy("y")
    assert got.dtype == np.float32 and got.shape == (batch, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # outputs travel as raw bytes, not typed contents
    assert len(res.get_response().raw_output_contents) == 1


def test_response_parameters_positive(mlp_server) -> None:
    c = tc.InferenceServerClient(mlp_server.url)
    x = np.ones((2, 16), np.float32)
    for _ in range(3):
        params = _infer(c, "model", x=x).get_response().parameters
        assert params["farm_queue_ns"].int64_param > 0
        assert params["farm_compute_ns"].int64_param > 0


def test_statistics_increase(mlp_server) -> None:
    c = tc.InferenceServerClient(mlp_server.url)
    before = c.get_inference_statistics("model").model_stats[0]
    n, batch = 4, 3
    x = np.ones((batch, 16), np.float32)
    for _ in range(n):
        _infer(c, "model", x=x)
    after = c.get_inference_statistics("model").model_stats[0]
    b, a = before.inference_stats, after.inference_stats
    assert a.success.count == b.success.count + n
    assert a.success.ns > b.success.ns
    assert a.queue.count == b.queue.count + n and a.queue.ns > b.queue.ns
    assert a.compute_infer.count == b.compute_infer.count + n and a.compute_infer.ns > b.compute_infer.ns
    assert a.compute_input.count == b.compute_input.count + n
    assert a.compute_output.count == b.compute_output.count + n
    assert after.execution_count == before.execution_count + n
    assert after.inference_count == before.inference_count + n * batch
    assert after.last_inference >= before.last_inference > 0 or before.execution_count == 0
    # the whole request takes at least as long as its compute part
    assert a.success.ns >= a.compute_infer.ns
    all_stats = c.get_inference_statistics("").model_stats
    assert [s.name for s in all_stats] == ["model"]


def test_typed_contents_and_two_dtypes(identity_server) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    with grpc.insecure_channel(identity_server.url) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        req = pb.ModelInferRequest(model_name="ident", id="r1")
        t = req.inputs.add(name="x", datatype="FP32", shape=[2, 4])
        t.contents.fp32_contents.extend(x.ravel().tolist())
        t = req.inputs.add(name="ids", datatype="INT64", shape=[2, 3])
        t.contents.int64_contents.extend(ids.ravel().tolist())
        req.outputs.add(name="ids_out")  # ask for one output only
        resp = stub.ModelInfer(req, timeout=30)
    assert resp.id == "r1"
    assert [o.name for o in resp.outputs] == ["ids_out"]
    got = np.frombuffer(resp.raw_output_contents[0], np.int64).reshape(tuple(resp.outputs[0].shape))
    np.testing.assert_array_equal(got, ids)


def test_identity_raw_both_outputs(identity_server) -> None:
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    ids = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 2**40]], np.int64)
    res = _infer(tc.InferenceServerClient(identity_server.url), "ident", x=x, ids=ids)
    np.testing.assert_array_equal(res.as_numpy("y"), x)
    np.testing.assert_array_equal(res.as_numpy("ids_out"), ids)


def test_two_instances_serve_concurrent_requests(identity_server) -> None:
    c = tc.InferenceServerClient(identity_server.url)

    def one(k: int) -> bool:
        x = np.full((1, 4), k, np.float32)
        ids = np.full((1, 3), k, np.int64)
        res = _infer(c, "ident", x=x, ids=ids)
        return bool((res.as_numpy("y") == k).all() and (res.as_numpy("ids_out") == k).all())

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, range(64)))


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: [("z", np.ones((1, 16), np.float32), "FP32")], "unknown input 'z'"),
        (lambda: [("x", np.ones((1, 16), np.float64), "FP64")], "datatype FP64"),
        (lambda: [("x", np.ones((1, 15), np.float32), "FP32")], "shape [1, 15]"),
        (lambda: [("x", np.ones((16,), np.float32), "FP32")], "shape [16]"),
        (lambda: [], "missing input"),
    ],
)
def test_bad_inputs_are_invalid_argument(mlp_server, build, needle: str) -> None:
    c = tc.InferenceServerClient(mlp_server.url)
    inputs = []
    for name, arr, dt in build():
        i = tc.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    with pytest.raises(InferenceServerException) as ei:
        c.infer("model", inputs)
    assert ei.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert needle in ei.value.message()


def test_raw_size_mismatch_and_unknown_model(mlp_server) -> None:
    with grpc.insecure_channel(mlp_server.url) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        req = pb.ModelInferRequest(model_name="model")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 16])
        req.raw_input_contents.append(b"\0" * 12)
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "raw bytes" in ei.value.details()
        req.model_name = "nope"
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    c = tc.InferenceServerClient(mlp_server.url)
    fails = c.get_inference_statistics("model").model_stats[0].inference_stats.fail
    assert fails.count >= 1


def test_sigterm_exits_cleanly_and_frees_port(mlp_onnx: Path, start_server) -> None:
    with start_server(mlp_onnx) as s:
        wait_ready(s.url, "model", timeout_s=30)
        _infer(tc.InferenceServerClient(s.url), "model", x=np.ones((1, 16), np.float32))
        assert not _port_free(s.host, s.port)
        rc = s.stop()
        assert rc == 0
        assert s.proc.stderr is not None
        assert s.proc.stderr.read() == b""
    assert _port_free(s.host, s.port)


def test_model_load_error_exits_2_with_one_line(tmp_path: Path, serve_cmd, repo_root: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not onnx")
    r = subprocess.run(serve_cmd(bad), cwd=repo_root, capture_output=True, timeout=120)
    assert r.returncode == 2
    assert r.stdout == b""
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "cannot load model" in lines[0]


def test_missing_model_file_exits_2(tmp_path: Path, serve_cmd, repo_root: Path) -> None:
    r = subprocess.run(serve_cmd(tmp_path / "absent.onnx"), cwd=repo_root, capture_output=True, timeout=120)
    assert r.returncode == 2
    assert "does not exist" in r.stderr.decode()


def test_port_in_use_exits_3(mlp_onnx: Path, repo_root: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "workers.engines.server", str(mlp_onnx), "--port", str(port)]
        r = subprocess.run(cmd, cwd=repo_root, capture_output=True, timeout=120)
    assert r.returncode == 3
    assert b"cannot bind" in r.stderr


def test_inprocess_serve_api(mlp_onnx: Path) -> None:
    import asyncio

    from workers.engines.server import ServerConfig, load_model, serve

    cfg = ServerConfig(model_path=mlp_onnx, model_format="onnx", engine="onnxruntime", threads=1,
                       instances=2, model_name="m2")
    model = load_model(cfg)
    seen: dict[str, object] = {}

    async def main() -> None:
        stop = asyncio.Event()
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(cfg, model, stop, lambda h, p: bound.set_result(p)))
        port = await asyncio.wait_for(bound, 30)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            seen["ready"] = (await stub.ModelReady(pb.ModelReadyRequest(name="m2"), timeout=10)).ready
            req = pb.ModelInferRequest(model_name="m2")
            req.inputs.add(name="x", datatype="FP32", shape=[2, 16])
            req.raw_input_contents.append(np.ones((2, 16), np.float32).tobytes())
            resps = await asyncio.gather(*[stub.ModelInfer(req, timeout=30) for _ in range(8)])
            seen["shapes"] = {tuple(r.outputs[0].shape) for r in resps}
        stop.set()
        await asyncio.wait_for(task, 30)

    try:
        asyncio.run(main())
    finally:
        model.close()
    assert seen == {"ready": True, "shapes": {(2, 4)}}
    assert model.stats.success_count == 8 and model.stats.inference_count == 16


def test_queue_time_grows_when_requests_wait_for_the_instance(identity_onnx: Path, start_server) -> None:
    """One instance, many concurrent requests: the server reports time spent waiting for it."""
    with start_server(identity_onnx, "--threads", "1") as s:
        c = tc.InferenceServerClient(s.url)
        x = np.ones((512, 4), np.float32)
        ids = np.ones((512, 3), np.int64)

        def one(_: int) -> tuple[int, int]:
            p = _infer(c, "model", x=x, ids=ids).get_response().parameters
            return p["farm_queue_ns"].int64_param, p["farm_compute_ns"].int64_param

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(64)))
        assert all(q > 0 and comp > 0 for q, comp in results)
        st = c.get_inference_statistics("model").model_stats[0].inference_stats
        assert st.queue.count == 64 and st.queue.ns == sum(q for q, _ in results)
        assert st.compute_infer.ns == sum(comp for _, comp in results)


def test_model_config_rpc(mlp_server) -> None:
    cfg = tc.InferenceServerClient(mlp_server.url).get_model_config("model").config
    assert cfg.name == "model" and cfg.backend == "onnxruntime"
    assert cfg.max_batch_size > 0  # a dynamic batch axis: dims per sample, as Triton reports them
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("x", [16])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("y", [4])]


def _stream_answers(url: str, model: str, requests: list[tuple[str, list[tc.InferInput]]]) -> dict[str, object]:
    """Send ``(id, inputs)`` over one ModelStreamInfer stream with tritonclient; {id or error text: answer}."""
    import queue

    answers: queue.SimpleQueue[tuple[object, object]] = queue.SimpleQueue()
    c = tc.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for rid, inputs in requests:
            c.async_stream_infer(model if rid != "unknown-model" else "nope", inputs, request_id=rid)
        got: dict[str, object] = {}
        for _ in requests:
            result, error = answers.get(timeout=30)
            if error is not None:
                got[error.message()] = error
            else:
                got[result.get_response().id] = result
    finally:
        c.stop_stream()
        c.close()
    return got


def _fp32(name: str, arr: np.ndarray) -> tc.InferInput:
    i = tc.InferInput(name, list(arr.shape), "FP32")
    i.set_data_from_numpy(arr)
    return i


def test_stream_infer_answers_every_request_and_survives_errors(mlp_server, mlp_onnx: Path) -> None:
    """ModelStreamInfer, driven by tritonclient's own stream client: each answer carries its request's
    id, outputs and timing parameters; a bad request and an unknown model get error messages naming
    their status, and the stream goes on to answer the requests after them."""
    sess = ort.InferenceSession(str(mlp_onnx), providers=["CPUExecutionProvider"])
    c = tc.InferenceServerClient(mlp_server.url)
    before = c.get_inference_statistics("model").model_stats[0].inference_stats
    xs = {f"r{k}": np.random.default_rng(k).standard_normal((k + 1, 16)).astype(np.float32) for k in range(6)}
    reqs = [(rid, [_fp32("x", x)]) for rid, x in list(xs.items())[:3]]
    reqs += [("bad-input", [_fp32("z", np.ones((1, 16), np.float32))]),
             ("unknown-model", [_fp32("x", np.ones((1, 16), np.float32))])]
    reqs += [(rid, [_fp32("x", x)]) for rid, x in list(xs.items())[3:]]
    got = _stream_answers(mlp_server.url, "model", reqs)
    for rid, x in xs.items():
        res = got[rid]
        np.testing.assert_allclose(res.as_numpy("y"), sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
        params = res.get_response().parameters
        assert params["farm_compute_ns"].int64_param > 0 and params["farm_queue_ns"].int64_param > 0
    errors = sorted(k for k in got if k not in xs)
    assert len(errors) == 2
    assert errors[0].startswith("INVALID_ARGUMENT: ") and "unknown input 'z'" in errors[0]
    assert errors[1].startswith("NOT_FOUND: ") and "unknown model 'nope'" in errors[1]
    after = c.get_inference_statistics("model").model_stats[0].inference_stats
    assert after.success.count == before.success.count + len(xs)
    assert after.fail.count == before.fail.count + 1  # the bad input; "nope" is not this model's failure


def test_stream_requests_run_concurrently_and_keep_their_ids(identity_server) -> None:
    """Requests of one stream are not serialized: with two instances, 32 requests all come back, each
    with its own id and its own data."""
    reqs = []
    for k in range(32):
        x = _fp32("x", np.full((1, 4), k, np.float32))
        ids = tc.InferInput("ids", [1, 3], "INT64")
        ids.set_data_from_numpy(np.full((1, 3), k, np.int64))
        reqs.append((f"q{k}", [x, ids]))
    got = _stream_answers(identity_server.url, "ident", reqs)
    assert sorted(got) == sorted(f"q{k}" for k in range(32))
    for k in range(32):
        assert (got[f"q{k}"].as_numpy("y") == k).all()
        assert (got[f"q{k}"].as_numpy("ids_out") == k).all()

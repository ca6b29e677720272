"""``farm submit --endpoint HOST:PORT --model-name NAME``: profiling running KServe v2 gRPC servers that
farm did not start, without a model file. A real third-party server (MLServer with its scikit-learn
runtime, from PyPI) and ``farm serve``; embedded and cluster mode."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import FAST, farm, farm_env, results_json, stop_group, submit_to_worker
from tests.workers.engines.conftest import build_mlp
from tests.workers.engines.test_engine_repository import farm_serve
from workers.engines.ready import wait_ready

MLSERVER_START_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_sklearn_repo(root: Path) -> Path:
    """A tiny logistic regression (4 FP64 features -> INT64 class) saved with joblib, with the
    model-settings.json of MLServer's scikit-learn runtime, under ``root/iris``."""
    import joblib
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.random((64, 4))
    folder = root / "iris"
    folder.mkdir(parents=True)
    joblib.dump(LogisticRegression().fit(x, (x[:, 0] > 0.5).astype(int)), folder / "model.joblib")
    (folder / "model-settings.json").write_text(json.dumps({
        "name": "iris", "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./model.joblib", "version": "v1"},
        "inputs": [{"name": "features", "datatype": "FP64", "shape": [-1, 4]}],
        "outputs": [{"name": "predict", "datatype": "INT64", "shape": [-1, 1]}]}))
    return root


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLServer serving the sklearn model over gRPC; yields HOST:PORT."""
    exe = shutil.which("mlserver")
    if exe is None:
        pytest.skip("mlserver is not installed (pip install '.[test]')")
    root = write_sklearn_repo(tmp_path_factory.mktemp("mlserver"))
    grpc_port = _free_port()
    (root / "settings.json").write_text(json.dumps({
        "http_port": _free_port(), "grpc_port": grpc_port, "metrics_port": _free_port(), "parallel_workers": 0,
        "metrics_endpoint": None, "host": "127.0.0.1"}))
    log = open(root / "mlserver.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([exe, "start", str(root)], cwd=root, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"127.0.0.1:{grpc_port}"
    try:
        wait_ready(url, "iris", MLSERVER_START_S, alive=lambda: proc.poll() is None)
        yield url
    finally:
        stop_group(proc, 30.0)
        log.close()


def _check_rows(rows: list[dict[str, object]], server: str, batches: list[int]) -> None:
    assert sorted(r["batch_size"] for r in rows) == batches  # type: ignore[type-var]
    for row in rows:
        assert row["status"] == "succeeded", row
        assert row["engine"] == "endpoint" and row["server"] == server
        assert row["error_count"] == 0 and row["throughput_infer_per_s"] > 0  # type: ignore[operator]


@pytest.mark.slow
def test_profiles_mlserver_without_a_model_file(mlserver: str) -> None:
    farm("submit", "--endpoint", mlserver, "--model-name", "iris", "--batch-sizes", "1,8", *FAST)
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    _check_rows(results_json(rid, farm_env()), f"mlserver {version('mlserver')}", [1, 8])
    assert "mlserver" in farm("results", rid).stdout


def test_profiles_farm_serve_with_dynamic_dims_from_input(tmp_path: Path) -> None:
    model = build_mlp(tmp_path / "mlp.onnx")
    with farm_serve(model) as url:
        bad = farm("submit", "--endpoint", url, "--model-name", "nope", check=False)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "nope" in bad.stderr and "Traceback" not in bad.stderr
        wrong = farm("submit", "--endpoint", url, "--model-name", "mlp", "--input", "x:FP32:15", check=False)
        assert wrong.returncode == 2 and "x" in wrong.stderr and "[-1, 16]" in wrong.stderr, wrong.stderr
        farm("submit", "--endpoint", url, "--model-name", "mlp", "--input", "x:FP32:16", "--input-data", "zeros",
             "--client", "farm", *FAST)  # farm's generator: it reads the server's per-request compute time
        rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
        rows = results_json(rid, farm_env())
    _check_rows(rows, "farm 0.1.0", [1])
    assert rows[0]["input_data"] == "zeros"
    assert rows[0]["client"] == "farm" and rows[0]["server_compute_p50_ms"] is not None


def test_dynamic_dims_need_input(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, save

    g = helper.make_graph([helper.make_node("Relu", ["tokens"], ["y"])], "seq",
                          [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["N", "S"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    save(m, str(tmp_path / "seq.onnx"))
    with farm_serve(tmp_path / "seq.onnx") as url:
        proc = farm("submit", "--endpoint", url, "--model-name", "seq", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "'tokens'" in lines[0] and "--input tokens:FP32:N" in lines[0]


def test_the_endpoint_is_read_by_the_client_the_cli_passes_in(sqlite_url: str) -> None:
    """farm core does not import workers: ``describe_endpoint`` reads the metadata with the ``attach`` it is given
    (the CLI gives the KServe client's), and a submission of an endpoint without one says what is missing."""
    from dataclasses import dataclass, field

    from farm.endpoint import describe_endpoint
    from farm.errors import RequestError
    from scheduler.enqueue import submit
    from schemas import ProfileRequest
    from workers.engines.base import IOSpec

    @dataclass
    class Served:
        server_name: str = "fake"
        server_version: str = "1"
        platform: str = "onnxruntime_onnx"
        inputs: list[IOSpec] = field(default_factory=lambda: [IOSpec("x", "FP32", (-1, 16))])
        outputs: list[IOSpec] = field(default_factory=lambda: [IOSpec("y", "FP32", (-1, 2))])

    asked: list[tuple[str, str, float]] = []

    def attach(url: str, model_name: str, timeout_s: float) -> Served:
        asked.append((url, model_name, timeout_s))
        return Served()

    request = ProfileRequest(endpoint="127.0.0.1:9", model_name="mlp")
    path, desc = describe_endpoint(request, attach)
    assert asked == [("127.0.0.1:9", "mlp", 10.0)] and json.loads(path.read_text()) == desc
    assert desc["server"] == {"name": "fake", "version": "1"} and desc["inputs"][0]["shape"] == [16]
    with pytest.raises(RequestError, match="attach="):
        submit(request, send=False)


def test_bad_endpoint_options_are_one_line_errors(example_onnx: Path) -> None:
    for args, needle in ((["--endpoint", "localhost"], "HOST:PORT"),
                         (["--endpoint", "127.0.0.1:1"], "model_name"),
                         ([str(example_onnx), "--endpoint", "127.0.0.1:1", "--model-name", "m"], "without a model"),
                         (["--endpoint", "127.0.0.1:1", "--model-name", "m", "--engine", "triton"], "drop engines")):
        proc = farm("submit", *args, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1 and needle in lines[0], (args, proc.stderr)


@pytest.mark.slow
def test_cluster_worker_profiles_the_endpoint(cluster_env: dict[str, str], mlserver: str, tmp_path: Path) -> None:
    """A cluster reaches no endpoint until its operator lists it (farm.egress): here the loopback server, by name."""
    env = farm_env(**cluster_env, FARM_ENDPOINT_ALLOW=mlserver)
    counts, rows = submit_to_worker(env, ["--endpoint", mlserver, "--model-name", "iris", "--batch-sizes", "2"],
                                    tmp_path / "worker.log")
    assert counts == {"succeeded": 1}, (tmp_path / "worker.log").read_text()[-3000:]
    _check_rows(rows, f"mlserver {version('mlserver')}", [2])



"""DockerRunner.serve(): real containers from the locally built image, on farm's internal network, reached at their
address there (no port published on the host)."""
from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from farm.errors import ContainerError
from farm.settings import get_settings

pytestmark = pytest.mark.docker


def _farm_containers(client: Any, **labels: str) -> list[Any]:
    flt = ["farm.owner=farm"] + [f"{k}={v}" for k, v in labels.items()]
    return client.containers.list(all=True, ignore_removed=True, filters={"label": flt})


def test_serving_container_matches_in_process_onnxruntime(runner: Any, models: dict[str, Path],
                                                          make_spec: Any) -> None:
    import onnxruntime as ort
    import tritonclient.grpc as grpcclient

    x = np.random.default_rng(1).random((4, 256), dtype=np.float32)
    expected = ort.InferenceSession(str(models["mlp"])).run(["output"], {"input": x})[0]
    with runner.serve(make_spec(models["mlp"]), models["mlp"]) as target:
        assert target.host != "127.0.0.1" and target.port == 8001  # the container's address on farm's network
        assert target.container_id
        client = grpcclient.InferenceServerClient(url=target.url)
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(target.model_name, [inp]).as_numpy("output")
        client.close()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_serving_container_is_hardened_on_the_internal_network(
    runner: Any, docker_client: Any, models: dict[str, Path], make_spec: Any
) -> None:
    spec = make_spec(models["mlp"])
    with runner.serve(spec, models["mlp"]) as target:
        c = docker_client.containers.get(target.container_id)
        hc = c.attrs["HostConfig"]
        assert hc["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in hc["SecurityOpt"]
        assert hc["ReadonlyRootfs"] is True
        assert "/tmp" in hc["Tmpfs"]
        assert hc["PidsLimit"] and hc["PidsLimit"] > 0
        assert hc["Memory"] == hc["MemorySwap"] == get_settings().server_memory  # the job's memory limit, no swap
        assert c.attrs["Config"]["User"] == "65534:65534"
        assert not hc["PortBindings"]  # nothing published on the host
        assert list(c.attrs["NetworkSettings"]["Networks"]) == ["farm-serving"]
        assert docker_client.networks.get("farm-serving").attrs["Internal"] is True
        assert c.attrs["Config"]["Env"] is None or not any(e.startswith("FARM_") for e in c.attrs["Config"]["Env"])
        mounts = c.attrs["Mounts"]
        assert len(mounts) == 1 and mounts[0]["RW"] is False and mounts[0]["Destination"].startswith("/model/")
        labels = c.labels
        assert labels["farm.owner"] == "farm"
        assert labels["farm.job_id"] == spec.job_id
        assert labels["farm.worker_id"] == runner.worker_id
        assert target.cgroup_path is not None and target.cgroup_path.is_dir()


def test_reuse_same_settings_same_container(
    runner: Any, docker_client: Any, models: dict[str, Path], make_spec: Any
) -> None:
    with runner.serve(make_spec(models["mlp"], threads=1), models["mlp"]) as t1:
        first = t1.container_id
    with runner.serve(make_spec(models["mlp"], threads=1), models["mlp"]) as t2:
        assert t2.container_id == first
        assert any("reused" in n for n in t2.notes)
    with runner.serve(make_spec(models["mlp"], threads=2), models["mlp"]) as t3:
        assert t3.container_id != first  # other server settings: a new container
    assert not [c for c in _farm_containers(docker_client) if c.id == first]  # replaced one removed
    runner.close()
    assert not _farm_containers(docker_client, **{"farm.worker_id": runner.worker_id})


def test_reused_container_removed_after_idle_timeout(
    docker_client: Any, make_runner: Any, worker_id: str, models: dict[str, Path], make_spec: Any
) -> None:
    r = make_runner(idle_timeout_s=1.0)
    try:
        with r.serve(make_spec(models["mlp"]), models["mlp"]) as t:
            cid = t.container_id
        assert [c.id for c in _farm_containers(docker_client, **{"farm.worker_id": worker_id})] == [cid]
        deadline = time.monotonic() + 30
        while _farm_containers(docker_client, **{"farm.worker_id": worker_id}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _farm_containers(docker_client, **{"farm.worker_id": worker_id})
    finally:
        r.close()


def test_no_reuse_removes_container_on_exit(
    docker_client: Any, make_runner: Any, worker_id: str, models: dict[str, Path], make_spec: Any
) -> None:
    with make_runner(reuse=False) as r:
        with r.serve(make_spec(models["mlp"]), models["mlp"]) as t:
            assert docker_client.containers.get(t.container_id).status == "running"
        assert not _farm_containers(docker_client, **{"farm.worker_id": worker_id})


def test_error_in_body_removes_even_a_reusable_container(
    runner: Any, docker_client: Any, models: dict[str, Path], make_spec: Any
) -> None:
    with pytest.raises(RuntimeError, match="measurement failed"):
        with runner.serve(make_spec(models["mlp"]), models["mlp"]):
            raise RuntimeError("measurement failed")
    assert not _farm_containers(docker_client, **{"farm.worker_id": runner.worker_id})


def test_server_that_never_becomes_ready_times_out_and_is_removed(
    docker_client: Any, make_runner: Any, worker_id: str, models: dict[str, Path], make_spec: Any
) -> None:
    r = make_runner(ready_timeout_s=3,
                    server_command=["python", "-c", "print('loading forever', flush=True); import time; "
                                    "time.sleep(600)"])
    spec = make_spec(models["mlp"])
    with pytest.raises(ContainerError) as err:
        with r.serve(spec, models["mlp"]):
            pytest.fail("serve() yielded a server that never became ready")
    msg = str(err.value)
    assert "not ready within 3 s" in msg
    assert "loading forever" in msg  # the container's last log lines
    assert not _farm_containers(docker_client, **{"farm.job_id": spec.job_id})
    r.close()


def test_server_that_crashes_reports_exit_code_and_logs(
    docker_client: Any, make_runner: Any, worker_id: str, models: dict[str, Path], make_spec: Any
) -> None:
    r = make_runner(ready_timeout_s=30,
                    server_command=["python", "-c", "import sys; print('cannot load {model}'); sys.exit(3)"])
    spec = make_spec(models["mlp"])
    with pytest.raises(ContainerError) as err:
        with r.serve(spec, models["mlp"]):
            pass
    assert "exited with code 3" in str(err.value)
    assert "cannot load /model/mlp.onnx" in str(err.value)
    assert not _farm_containers(docker_client, **{"farm.job_id": spec.job_id})


def test_cleanup_orphans_removes_only_own_containers(
    docker_client: Any, runtime_image: str, make_runner: Any, worker_id: str
) -> None:
    from workers.runners import hardening as hd

    mine = docker_client.containers.run(runtime_image, ["python", "-c", "import time; time.sleep(600)"],
                                        detach=True, labels=hd.labels(worker_id, "crashed-job", "serve"),
                                        network_mode="none", **hd.hardening())
    other_id = worker_id + "-other"
    other = docker_client.containers.run(runtime_image, ["python", "-c", "import time; time.sleep(600)"],
                                         detach=True, labels=hd.labels(other_id, "their-job", "serve"),
                                         network_mode="none", **hd.hardening())
    try:
        r = make_runner()
        assert mine.id in r.orphans_removed
        assert not _farm_containers(docker_client, **{"farm.worker_id": worker_id})
        assert [c.id for c in _farm_containers(docker_client, **{"farm.worker_id": other_id})] == [other.id]
    finally:
        hd.remove(other, stop_timeout_s=1)
        hd.remove(mine, stop_timeout_s=1)


def test_unreadable_model_is_refused_with_a_fix(runner: Any, tmp_path: Path, models: dict[str, Path],
                                                make_spec: Any) -> None:
    secret = tmp_path / "secret.onnx"
    secret.write_bytes(models["mlp"].read_bytes())
    secret.chmod(0o600)
    with pytest.raises(ContainerError, match="chmod o\\+r"):
        with runner.serve(make_spec(secret), secret):
            pass


def test_gpu_job_requests_its_gpu_by_uuid(docker_client: Any, make_runner: Any, models: dict[str, Path],
                                          make_spec: Any) -> None:
    from schemas import GpuInfo

    gpu = GpuInfo(index=0, uuid="GPU-00000000-farm-test", name="NVIDIA A100-SXM4-40GB", slug="a100-sxm4-40gb",
                  memory_total_bytes=40 << 30)
    r = make_runner(gpus=[gpu])
    assert r._gpu_uuids("gpu:a100-sxm4-40gb") == [gpu.uuid]
    assert r._gpu_uuids("gpu") == [gpu.uuid]
    assert r._gpu_uuids("cpu") == []
    with pytest.raises(ContainerError, match="no such GPU"):
        r._gpu_uuids("gpu:h100")
    spec = make_spec(models["mlp"]).model_copy(update={"device": "gpu:a100-sxm4-40gb"})
    if any(k for k in (docker_client.info().get("Runtimes") or {}) if "nvidia" in k):
        pytest.skip("this host has the NVIDIA runtime; the refusal below is only seen without it")
    with pytest.raises(ContainerError, match="NVIDIA container toolkit"):  # no GPU runtime on this host
        with r.serve(spec, models["mlp"]):
            pass
    assert not _farm_containers(docker_client, **{"farm.job_id": spec.job_id})
    r.close()


def test_a_starting_worker_removes_containers_left_by_a_dead_worker_on_its_host(
        docker_client: Any, make_runner: Any, models: dict[str, Path], make_spec: Any, sqlite_url: str) -> None:
    """A worker killed with -9 cannot clean up; the next worker on the host removes its containers."""
    from sqlalchemy import update

    import docker as docker_sdk
    from farm.db.models import Worker
    from farm.db.session import session_scope
    from workers.hardware import detect_hardware
    from workers.node import WorkerNode

    hw = detect_hardware(docker=True)
    dead_runner = make_runner(reuse=True, worker_id=f"dead-{uuid.uuid4().hex[:6]}")
    WorkerNode(runner=dead_runner, hardware=hw, worker_id=dead_runner.worker_id).register()
    with dead_runner.serve(make_spec(models["mlp"]), models["mlp"]) as target:
        container_id = target.container_id  # kept for reuse: still running, as after a kill -9
    with session_scope() as s:
        s.execute(update(Worker).where(Worker.id == dead_runner.worker_id).values(status="lost"))
    assert docker_client.containers.get(container_id).status == "running"
    new_runner = make_runner(worker_id=f"new-{uuid.uuid4().hex[:6]}")
    assert docker_client.containers.get(container_id).status == "running"  # not this worker's own
    with WorkerNode(runner=new_runner, hardware=hw, worker_id=new_runner.worker_id):
        with pytest.raises(docker_sdk.errors.NotFound):
            docker_client.containers.get(container_id)


@pytest.mark.slow
def test_torchscript_job_runs_in_the_images_torch_variant(make_runner: Any, docker_client: Any, make_spec: Any,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    """farm's local image has no PyTorch (330 MB vs 1 GB); a TorchScript job gets its ``-torch`` variant,
    built from the host's torch at the first such job, and computes what torch computes in-process. The
    job's input shapes reach the server (a plain TorchScript file carries none)."""
    torch = pytest.importorskip("torch", reason="TorchScript jobs need farm[torch] on the worker")
    from schemas import TensorSpec
    from workers.images import DEFAULT_TAG

    d = tmp_path_factory.mktemp("torchscript")
    d.chmod(0o755)
    model = d / "plain.pt"  # saved without farm's input declaration: only the job knows the shapes
    torch.manual_seed(0)
    torch.jit.script(torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 10))).save(str(model))
    model.chmod(0o644)
    spec = make_spec(model, inputs=[TensorSpec(name="input", shape=(256,))]).model_copy(
        update={"model_format": "torchscript", "engine": "torchscript"})
    runner = make_runner(build_image=True)
    x = np.random.default_rng(2).random((3, 256), dtype=np.float32)
    with torch.no_grad():
        expected = torch.jit.load(str(model))(torch.from_numpy(x)).numpy()
    with runner.serve(spec, model) as target:
        image = docker_client.containers.get(target.container_id).attrs["Config"]["Image"]
        argv = docker_client.containers.get(target.container_id).attrs["Config"]["Cmd"]
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(url=target.url)
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(target.model_name, [inp]).as_numpy("output__0")
        client.close()
    assert image == f"{DEFAULT_TAG}-torch"
    assert argv[argv.index("--input") + 1] == "input:FP32:-1x256"
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    onnx_spec = make_spec(model)  # engine onnxruntime: the runner's own image, no torch variant
    assert runner.image_for(onnx_spec) == DEFAULT_TAG


def test_torchscript_job_on_a_worker_without_torch_is_refused_with_a_fix(
        make_runner: Any, docker_client: Any, make_spec: Any, models: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose Python has no PyTorch cannot build the image's torch variant: ``serve()`` refuses
    the TorchScript job with a one-line ContainerError naming the fix, before any container starts, and
    the same runner still serves an ONNX job afterwards."""
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # what the import system reports when torch is absent
    runner = make_runner(build_image=True)
    spec = make_spec(models["mlp"]).model_copy(update={"model_format": "torchscript", "engine": "torchscript"})
    before = {c.id for c in _farm_containers(docker_client)}
    with pytest.raises(ContainerError) as err, runner.serve(spec, models["mlp"]):
        pytest.fail("a TorchScript job was served without PyTorch")
    msg = str(err.value)
    assert "\n" not in msg and spec.job_id in msg
    assert "pip install 'farm[torch]'" in msg and "onnxruntime engine" in msg
    assert {c.id for c in _farm_containers(docker_client)} == before, "a container was started anyway"
    with runner.serve(make_spec(models["mlp"]), models["mlp"]) as target:
        assert target.port > 0


@pytest.mark.slow
def test_openvino_job_runs_in_the_images_openvino_variant(make_runner: Any, docker_client: Any, make_spec: Any,
                                                          models: dict[str, Path]) -> None:
    """An OpenVINO job gets the image's ``-openvino`` variant (built from the host's openvino) and computes
    what ONNX Runtime computes in-process on the same file."""
    pytest.importorskip("openvino", reason="OpenVINO jobs need farm[openvino] on the worker")
    import tritonclient.grpc as grpcclient

    from schemas import TensorSpec
    from workers.engines.backends import make_backend
    from workers.images import DEFAULT_TAG

    spec = make_spec(models["mlp"], inputs=[TensorSpec(name="input", shape=(256,))]).model_copy(
        update={"engine": "openvino"})
    runner = make_runner(build_image=True)
    name = spec.inputs[0].name
    x = np.random.default_rng(3).random((2, *spec.inputs[0].shape), dtype=np.float32)
    with make_backend("onnxruntime") as ort:
        ort.load(models["mlp"], "cpu", 1)
        expected = ort.infer({name: x})
    with runner.serve(spec, models["mlp"]) as target:
        image = docker_client.containers.get(target.container_id).attrs["Config"]["Image"]
        client = grpcclient.InferenceServerClient(url=target.url)
        inp = grpcclient.InferInput(name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer(target.model_name, [inp])
        client.close()
    assert image == f"{DEFAULT_TAG}-openvino"
    for out, want in expected.items():
        np.testing.assert_allclose(result.as_numpy(out), want, rtol=1e-4, atol=1e-5)

"""The serving layer: every engine of ``schemas.engines`` has one serving entry (and each in-process one a
backend), launches are declared once per engine and placed by runners that never name an engine."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from farm.errors import UnsupportedError
from schemas import JobSpec, MeasurementSettings, TensorSpec
from schemas.engines import CARDS, IN_PROCESS, SERVED_MODEL_NAME
from workers.engines.backends import BACKENDS
from workers.runners import docker as docker_runner
from workers.runners import process as process_runner
from workers.serving.builtin import LISTEN_LINE
from workers.serving.registry import SERVING, serving_engine

RUNNERS = Path(__file__).resolve().parents[3] / "workers" / "runners"


def _spec(engine: str = "onnxruntime", model_format: str = "onnx") -> JobSpec:
    return JobSpec(job_id="s" * 32, request_id="r", model_sha256="0" * 64, model_format=model_format,
                   inputs=[TensorSpec(name="x", shape=(16,))], device="cpu", engine=engine, batch_size=1,
                   concurrency=1, queue="farm.cpu", measurement=MeasurementSettings(threads=2, instances=3))


def test_every_engine_has_one_serving_entry_and_each_in_process_one_a_backend() -> None:
    assert set(SERVING) == set(CARDS)
    assert set(BACKENDS) == set(IN_PROCESS)
    assert all(serving_engine(e).name == e for e in CARDS)
    with pytest.raises(UnsupportedError, match="unknown"):
        serving_engine("tensorrt")


def test_runners_name_no_engine() -> None:
    names = re.compile("|".join(sorted(CARDS.keys() - {"endpoint"})), re.IGNORECASE)
    found = [f"{p.name}:{n}" for p in sorted(RUNNERS.glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if names.search(line)]
    assert found == []


def test_the_built_in_servers_launch_is_one_command_line_placed_on_either_site(mlp_onnx: Path) -> None:
    engine = serving_engine("onnxruntime")
    local = engine.launch(_spec(), mlp_onnx, process_runner.SITE)
    boxed = engine.launch(_spec(), mlp_onnx, docker_runner.SITE)
    assert local.model_name == boxed.model_name == SERVED_MODEL_NAME
    assert local.listen_prefix == boxed.listen_prefix == LISTEN_LINE
    assert local.image is boxed.image is None  # farm's own image in a container
    assert local.mounts == {} and boxed.mounts == {str(mlp_onnx.resolve()): f"/model/{mlp_onnx.name}"}
    differ = {i for i, (a, b) in enumerate(zip(local.argv, boxed.argv, strict=True)) if a != b}
    assert [(local.argv[i], boxed.argv[i]) for i in sorted(differ)] == [
        (process_runner.SITE.python, "python"), (str(mlp_onnx), f"/model/{mlp_onnx.name}"),
        ("127.0.0.1", "0.0.0.0"), ("0", "8001")]
    assert local.argv[local.argv.index("--threads") + 1] == "2"
    assert local.argv[local.argv.index("--instances") + 1] == "3"


def test_torchscript_launch_declares_its_inputs_and_its_package(mlp_onnx: Path) -> None:
    engine = serving_engine("torchscript")
    launch = engine.launch(_spec("torchscript", "torchscript"), mlp_onnx, docker_runner.SITE)
    assert launch.argv[launch.argv.index("--input") + 1] == "x:FP32:-1x16"
    assert engine.package is not None and engine.package.extra == "torch"
    assert serving_engine("onnxruntime").package is not None and serving_engine("onnxruntime").package.extra is None


def test_triton_launches_only_in_a_container(mlp_onnx: Path) -> None:
    engine = serving_engine("triton")
    with pytest.raises(UnsupportedError, match="FARM_TRITON_URL"):
        engine.launch(_spec("triton"), mlp_onnx, process_runner.SITE)
    launch = engine.launch(_spec("triton"), mlp_onnx, docker_runner.SITE)
    assert launch.image and launch.argv[0] == "tritonserver" and launch.prepare is not None
    assert list(launch.mounts.values()) == ["/models"] and f"--grpc-port={docker_runner.SERVER_PORT}" in launch.argv

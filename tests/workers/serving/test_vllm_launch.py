"""vLLM's launch declaration without a GPU: the command line from the job's knobs, the job's GPU as each runner
binds it (the Docker runner's device request by UUID; the process runner's ``CUDA_VISIBLE_DEVICES``, turned
into the NVML index vLLM reads, through the fake libnvidia-ml), and the pins of the GPU image, the ``gpu`` extra
and the docs agreeing with ``workers.serving.vllm``."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from farm.errors import ContainerError, UnsupportedError
from farm.settings import reset_settings
from schemas import GpuInfo, JobSpec, MeasurementSettings
from schemas.engines import SERVED_MODEL_NAME
from tests.test_images import instruction, stages
from tests.workers.samplers.conftest import REPO, fake_nvml_dir, run_py  # noqa: F401  (fake NVML fixture)
from workers.images import requirement_closure
from workers.runners import docker as docker_runner
from workers.runners.process import SITE as PROCESS_SITE
from workers.runners.process import server_env
from workers.serving import vllm
from workers.serving.lease_exec import LISTEN_LINE

UUID0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GPUS = [GpuInfo(index=i, uuid=u, name=n, slug=s, memory_total_bytes=24 << 30)
        for i, (u, n, s) in enumerate([(UUID0, "NVIDIA L4", "l4"), (UUID1, "NVIDIA H100 80GB HBM3", "h100")])]


def spec(device: str = "gpu:h100", **knobs: Any) -> JobSpec:
    return JobSpec(job_id="v" * 32, request_id="r", model_sha256="0" * 64, model_format="hf", inputs=[],
                   device=device, engine="vllm", batch_size=1, concurrency=1, queue="farm.gpu.h100",
                   measurement=MeasurementSettings(), knobs=knobs)


@pytest.fixture
def with_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host has no vLLM: the launch's package check sees one (the launch only declares; nothing runs)."""
    monkeypatch.setattr(vllm, "require_module", lambda *a: None)


def _server_argv(argv: list[str]) -> list[str]:
    return argv[argv.index("--") + 1:]


def test_knobs_become_vllm_flags_and_the_model_is_served_as_model(with_vllm: None, tmp_path: Path) -> None:
    launch = vllm.Vllm().launch(spec(max_num_seqs=64, max_num_batched_tokens=4096, gpu_memory_utilization=0.5,
                                     enable_prefix_caching=False), tmp_path, PROCESS_SITE)
    wrapper, server = launch.argv[:launch.argv.index("--")], _server_argv(launch.argv)
    assert wrapper[1:4] == ["-m", "workers.serving.lease_exec", "--cuda-index"]
    assert server[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    flags = {a: server[i + 1] for i, a in enumerate(server[:-1]) if a.startswith("--") and server[i + 1][:2] != "--"}
    assert flags["--model"] == str(tmp_path) and flags["--served-model-name"] == SERVED_MODEL_NAME == "model"
    assert flags["--port"] == "{port}" and launch.listen_prefix == LISTEN_LINE  # a free port, printed
    assert (flags["--max-num-seqs"], flags["--max-num-batched-tokens"], flags["--gpu-memory-utilization"]) == (
        "64", "4096", "0.5")
    assert "--no-enable-prefix-caching" in server and "--enable-prefix-caching" not in server
    assert "--disable-uvicorn-access-log" in server
    assert launch.ready is vllm.wait_vllm_ready  # a tiny completion, not /health, with time to compile
    assert launch.env["HF_HUB_OFFLINE"] == "1" and launch.env["VLLM_NO_USAGE_STATS"] == "1"
    assert launch.shm_size is None  # a process shares the host's /dev/shm
    plain = _server_argv(vllm.Vllm().launch(spec(enable_prefix_caching=True), tmp_path, PROCESS_SITE).argv)
    assert "--enable-prefix-caching" in plain and not any(a.startswith("--max-num") for a in plain)


def test_vllm_gets_time_to_compile_before_its_first_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    monkeypatch.setattr(vllm, "wait_openai_ready", lambda url, name, timeout_s, alive=None: seen.append(timeout_s))
    vllm.wait_vllm_ready("h:1", "model", 60.0)
    vllm.wait_vllm_ready("h:1", "model", 1200.0)
    assert seen == [vllm.READY_FLOOR_S, 1200.0]


def test_a_worker_without_vllm_is_refused_with_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FARM_VLLM_PYTHON", raising=False)
    reset_settings()
    with pytest.raises(UnsupportedError, match=r"no vLLM CPU environment: set FARM_VLLM_PYTHON .*vllm_cpu_env"):
        vllm.Vllm().launch(spec(device="cpu"), tmp_path, PROCESS_SITE)
    monkeypatch.setenv("FARM_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    reset_settings()
    with pytest.raises(UnsupportedError, match="is not an executable Python"):
        vllm.Vllm().launch(spec(device="cpu"), tmp_path, PROCESS_SITE)
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(UnsupportedError, match=re.escape(f"pip install 'farm[gpu]' ({vllm.VLLM_PIN})")):
        vllm.Vllm().launch(spec(), tmp_path, PROCESS_SITE)


def test_a_cpu_job_runs_vllms_cpu_build_from_its_own_environment_on_the_lease(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU build's python (FARM_VLLM_PYTHON) runs the server; the wrapper binds its OpenMP threads to the leased
    cores; the KV cache is the knob or a share of the job's server memory; the venv is readable in the jail."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.symlink_to(sys.executable)
    monkeypatch.setenv("FARM_VLLM_PYTHON", str(python))
    monkeypatch.setenv("FARM_SERVER_MEMORY", "16g")
    reset_settings()
    launch = vllm.Vllm().launch(spec(device="cpu", max_num_seqs=8, block_size=64, dtype="bfloat16",
                                     enable_chunked_prefill=False, enable_prefix_caching=True), tmp_path, PROCESS_SITE)
    wrapper, server = launch.argv[:launch.argv.index("--")], _server_argv(launch.argv)
    assert "--cuda-index" not in wrapper
    assert wrapper[wrapper.index("--env-cpus") + 1] == "VLLM_CPU_OMP_THREADS_BIND"
    assert wrapper[wrapper.index("--env") + 1] == "OMP_NUM_THREADS"
    assert server[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    assert server[server.index("--block-size") + 1] == "64" and server[server.index("--dtype") + 1] == "bfloat16"
    assert server[server.index("--max-num-seqs") + 1] == "8"
    assert "--no-enable-chunked-prefill" in server and "--enable-prefix-caching" in server
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "4" and launch.env["HF_HUB_OFFLINE"] == "1"  # 16 GiB / 4
    assert launch.read_only == (str(venv), "/sys") and launch.server is not None and launch.server["name"] == "vllm-cpu"
    sized = vllm.Vllm().launch(spec(device="cpu", kv_cache_space=2), tmp_path, PROCESS_SITE)
    assert sized.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    with pytest.raises(UnsupportedError, match="gpu_memory_utilization is a knob of vLLM on a GPU"):
        vllm.Vllm().launch(spec(device="cpu", gpu_memory_utilization=0.5), tmp_path, PROCESS_SITE)
    with pytest.raises(UnsupportedError, match="process runner"):
        vllm.Vllm().launch(spec(device="cpu"), tmp_path, docker_runner.DockerRunner.site)


def test_the_wrapper_sets_the_leased_cores_as_a_cpu_list() -> None:
    core = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-m", "workers.serving.lease_exec", "--env-cpus", "BIND", "--env", "N", "--",
                          sys.executable, "-c", "import os; print(os.environ['BIND'], os.environ['N'])"],
                         capture_output=True, text=True, check=True, cwd=REPO,
                         preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert out.stdout.split() == [str(core), "1"]


def test_the_process_runner_binds_the_jobs_gpu_and_the_wrapper_gives_vllm_its_index(
        fake_nvml_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    env = server_env(spec(device="gpu:h100"), GPUS, vllm.ENV)
    assert env["CUDA_VISIBLE_DEVICES"] == UUID1 and env["HF_HUB_OFFLINE"] == "1"
    state = tmp_path / "nvml.state"
    state.write_text("".join(f"gpu {g.index} uuid {g.uuid}\ngpu {g.index} name {g.name}\n" for g in GPUS))
    show = ("import json, os; "
            "print(json.dumps([os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER')]))")
    wrapped = f"""
import os, sys
os.environ["CUDA_VISIBLE_DEVICES"] = {UUID1!r}
os.execv(sys.executable, [sys.executable, "-m", "workers.serving.lease_exec", "--cuda-index", "--", sys.executable,
                          "-c", {show!r}])
"""
    assert run_py(wrapped, fake_nvml_dir, state) == ["1", "PCI_BUS_ID"]
    bad = subprocess.run([sys.executable, "-m", "workers.serving.lease_exec", "--cuda-index", "--", "true"],
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "LD_LIBRARY_PATH": str(fake_nvml_dir),
                              "FAKE_NVML_STATE": str(state), "CUDA_VISIBLE_DEVICES": "GPU-not-there"},
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode != 0 and "NVML cannot find the job's GPU GPU-not-there" in bad.stderr
    assert "Traceback" not in bad.stderr


def _created(tmp_path: Path, **knobs: Any) -> dict[str, Any]:
    """What the Docker runner would create for a vLLM job on the H100 (the fake client stops at create)."""
    created: dict[str, Any] = {}

    def create(**kwargs: Any) -> Any:
        created.update(kwargs)
        raise RuntimeError("stop here: the test reads what the container would be")

    tmp_path.chmod(0o755)  # the model folder, readable by the container's user (nobody)
    client = mock.MagicMock()
    client.containers.create.side_effect = create
    network = mock.MagicMock(attrs={"Internal": True})
    network.name = "farm-serving"
    client.networks.list.return_value = [network]
    runner = docker_runner.DockerRunner("t", image="farm:0.1.0", gpus=GPUS, build_image=False, cleanup=False,
                                        reuse=False, docker_client=client)
    with pytest.raises(ContainerError, match="could not create the serving container"):
        with runner.serve(spec(device="gpu:h100", **knobs), tmp_path, None):
            pass
    return created


def test_the_docker_runner_requests_the_jobs_gpu_by_uuid(with_vllm: None, tmp_path: Path) -> None:
    created = _created(tmp_path, max_num_seqs=8)
    (request,) = created["device_requests"]
    assert request["DeviceIDs"] == [UUID1] and request["Capabilities"] == [["gpu"]]  # that GPU only, by UUID
    server = _server_argv(created["command"])
    assert server[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert server[server.index("--model") + 1] == f"/model/{tmp_path.name}" and "--max-num-seqs" in server
    assert created["shm_size"] == vllm.SHM_SIZE and created["environment"]["HF_HUB_OFFLINE"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in created["environment"]  # the container sees its one GPU as index 0
    assert created["image"] == "farm:0.1.0" and created["entrypoint"] == [""]  # farm's image, its CLI entrypoint off


def test_a_named_vllm_image_runs_the_server_itself(with_vllm: None, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_VLLM_IMAGE", "farm:0.1.0-vllm")  # docker/Dockerfile --target vllm
    reset_settings()
    created = _created(tmp_path)
    assert created["image"] == "farm:0.1.0-vllm" and created["entrypoint"] == [""]
    assert _server_argv(created["command"])[2] == "vllm.entrypoints.openai.api_server"
    assert created["device_requests"][0]["DeviceIDs"] == [UUID1]


def test_the_vllm_pin_is_the_same_in_the_code_the_extra_the_image_and_the_docs() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert pyproject["gpu"] == [vllm.VLLM_PIN] and vllm.VLLM_PIN == f"vllm=={vllm.VLLM_VERSION}"
    assert pyproject["torch"] != [vllm.VLLM_TORCH]  # farm's CPU torch pin is not vLLM's: never installed together
    all_stages = stages()
    build = " ".join(rest for op, rest in all_stages["build-vllm"]["lines"] if op == "RUN")
    assert '".[gpu]"' in build and "constraints.txt" not in build and "EXTRAS" not in build
    runtime = all_stages["vllm"]
    assert runtime["base"] == all_stages["cpu"]["base"]  # no CUDA base image: the nvidia-* wheels bring CUDA
    assert instruction(runtime, "USER") == "65534:65534" and instruction(runtime, "ENTRYPOINT") == '["farm"]'
    assert "gcc" in (instruction(runtime, "RUN") or "")  # Triton compiles its launchers at run time
    docs = (REPO / "docs" / "llm-engines.md").read_text()
    for text in (vllm.VLLM_PIN, vllm.VLLM_TORCH, "--target vllm", "farm[gpu]"):
        assert text in docs, text
    assert not (set(re.findall(r"vllm==[\d.]+", docs)) - {vllm.VLLM_PIN})  # no other release named


def test_the_images_gpu_variant_takes_vllms_requirements_as_installed() -> None:
    assert vllm.Vllm.package is not None and vllm.Vllm.package.closure and vllm.Vllm.package.extra == "gpu"
    if importlib.util.find_spec("vllm") is None:  # the Docker runner's refusal on a worker without vLLM
        why = vllm.Vllm.package.missing("j", "vllm") or ""
        assert "pip install 'farm[gpu]'" in why and "FARM_VLLM_IMAGE" in why and "onnxruntime" not in why
    got = requirement_closure(["celery"])  # one installed here with requirements of requirements
    assert {"celery", "kombu", "amqp", "vine", "billiard"} <= set(got)
    assert "pytest" not in got  # an optional extra's requirement is not followed

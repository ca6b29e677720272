"""Every LLM server farm launches runs jailed (issue 39 point 3): the jail is the default of every ``Launch``, applied
in one place (``workers.serving.jail``) by the process runner and LLM edge runs; the server has its own user, pid
and network namespaces, no worker secret, a read-only model, and a network where it reaches nothing while the load
client reaches it through farm's relay. Pickle weights are served only jailed; no jail: refused."""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from farm import sandbox
from farm.errors import SandboxError, UnsupportedError
from farm.settings import reset_settings
from schemas import JobSpec, MeasurementSettings
from schemas.engines import CARDS, is_openai
from tests.farm.test_egress import listener
from workers.runners.process import SITE, ProcessRunner
from workers.serving.base import Launch
from workers.serving.jail import confined
from workers.serving.lease_exec import LISTEN_LINE, PORT
from workers.serving.registry import SERVING

JAIL = pytest.mark.skipif(sandbox.jail_unavailable() is not None, reason=str(sandbox.jail_unavailable()))


def _spec(fmt: str = "gguf", engine: str = "llama.cpp", memory: int | None = None) -> JobSpec:
    return JobSpec(job_id="j" * 32, request_id="r", model_sha256="0" * 64, model_format=fmt, inputs=[],
                   device="cpu", engine=engine, batch_size=1, concurrency=1, queue="farm.cpu",
                   measurement=MeasurementSettings(llm={"api": "openai-chat"}, server_memory=memory))


def _ready(url: str, model_name: str, timeout_s: float, alive: Callable[[], bool] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError("the probe server exited")
        try:
            urllib.request.urlopen(f"http://{url}/", timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the probe server did not answer")


def _probe_launch(model: Path, host_port: int) -> Launch:
    """A stand-in LLM server (``jail_probe``) launched like the LLM engines: the lease wrapper picks its port."""
    argv = [sys.executable, "-m", "workers.serving.lease_exec", "--bind", "127.0.0.1", "--",
            sys.executable, "-m", "tests.workers.serving.jail_probe", PORT, str(host_port), str(model)]
    return Launch(argv=argv, port=0, model=str(model), listen_prefix=LISTEN_LINE, ready=_ready)


def _server(tree: list[psutil.Process], needle: str) -> psutil.Process:
    """The server itself in a jailed tree (not bwrap, not the relay: their command lines hold the server's too)."""
    return next(p for p in tree if p.name() != "bwrap" and needle in " ".join(p.cmdline())
                and "workers.serving.relay" not in p.cmdline())


def _ns(pid: int, ns: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{ns}")


def test_every_llm_launch_is_jailed_by_default(tiny_llama: object) -> None:
    """By construction: a ``Launch`` says nothing and gets the jail with its own network; every LLM engine's launch
    on a process site has it, whatever engine is added later (only farm's own server on a format that runs no
    code opts out)."""
    assert Launch(argv=["x"], port=0).sandbox == "server"
    checked = 0
    for name in (e for e in CARDS if is_openai(e)):
        model = getattr(tiny_llama, "gguf" if "gguf" in CARDS[name].formats else "hf")
        try:
            launch = SERVING[name].launch(_spec(engine=name), model, SITE)
        except UnsupportedError:  # vLLM: GPU workers only
            continue
        assert launch.sandbox == "server", name
        checked += 1
    assert checked >= 2
    onnx = SERVING["onnxruntime"].launch(_spec("onnx", "onnxruntime"), Path("/m.onnx"), SITE)
    assert onnx.sandbox == "none"


@JAIL
def test_a_jailed_server_reaches_nothing_and_is_reached_through_the_relay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_DATABASE_URL", "postgresql://farm:worker-s3cret@db/farm")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cloud-k3y")
    reset_settings()
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with listener() as host_service:
        launch = _probe_launch(model, host_service.port)
        cores = {sorted(psutil.Process().cpu_affinity() or [0])[0]}
        with ProcessRunner().place(_spec(), launch, cores) as target:
            assert any("relay" in n for n in target.notes)
            got = json.loads(urllib.request.urlopen(f"http://{target.url}/probe", timeout=10).read())
            tree = [psutil.Process(target.pid), *psutil.Process(target.pid).children(recursive=True)]
            server = _server(tree, "tests.workers.serving.jail_probe")
            for ns in ("net", "pid", "user", "mnt"):
                assert _ns(server.pid, ns) != _ns(os.getpid(), ns), ns
            for p in tree:  # the relay and the server keep the lease
                assert set(p.cpu_affinity()) <= cores, (p.name(), p.cpu_affinity())
        assert host_service.accepts == 0  # the host's loopback service never saw the jailed server
    assert got["host_loopback"].startswith("refused") and got["outside"].startswith("refused"), got
    assert got["model_write"].startswith("refused") and got["farm_env"] == [] and got["uid"] == sandbox.JAIL_UID
    assert max(got["pids"]) < 10  # its own pid namespace: the worker's processes are not there
    assert model.read_bytes() == b"GGUF"


@pytest.mark.llm
@JAIL
def test_llama_cpp_is_served_jailed(tiny_llama: object, tmp_path: Path) -> None:
    """Finding: ``--engine llama.cpp`` on the process runner ran the server as farm's own user, in farm's pid,
    user and network namespaces. Now it runs in the jail, and answers through the relay."""
    from tests.llm_servers import skip_without
    from workers.serving.llama_cpp import find_llama_server

    skip_without("llama.cpp")
    cores = {sorted(psutil.Process().cpu_affinity() or [0])[0]}
    with ProcessRunner().serve(_spec(), tiny_llama.gguf, cores) as target:  # type: ignore[attr-defined]
        tree = [psutil.Process(target.pid), *psutil.Process(target.pid).children(recursive=True)]
        server = _server(tree, "llama_cpp.server" if find_llama_server()[0] is None else "llama-server")
        for ns in ("net", "pid", "user"):
            assert _ns(server.pid, ns) != _ns(os.getpid(), ns), ns
        body = json.dumps({"model": target.model_name, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 2}).encode()
        req = urllib.request.Request(f"http://{target.url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        assert json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"]


def _pickle_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    return folder


def test_pickle_weights_only_in_the_jail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hugging Face folder with pytorch_model.bin (loading it unpickles): refused where the server would run
    unjailed (the operator's FARM_TRUSTED_MODELS), with what to do."""
    folder = _pickle_folder(tmp_path)
    launch = Launch(argv=["true"], port=0, model=str(folder), listen_prefix=LISTEN_LINE)
    monkeypatch.setenv("FARM_TRUSTED_MODELS", "1")
    reset_settings()
    with pytest.raises(SandboxError, match="pickle weights.*safetensors"), confined(launch, {}):
        pass
    if sandbox.jail_unavailable() is None:
        monkeypatch.delenv("FARM_TRUSTED_MODELS")
        reset_settings()
        with confined(launch, {}) as jail:
            assert jail.jailed and jail.argv[0] == "bwrap"


def test_without_a_jail_an_llm_server_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sandbox, "jail_unavailable", lambda: "bubblewrap (bwrap) is not installed")
    launch = Launch(argv=["true"], port=0, model=str(tmp_path / "m.gguf"), listen_prefix=LISTEN_LINE)
    with pytest.raises(SandboxError, match="sandbox, which this host lacks: bubblewrap") as err, \
            confined(launch, {}):
        pass
    assert "\n" not in str(err.value)


@JAIL
def test_the_server_gets_the_jobs_memory_limit(tmp_path: Path) -> None:
    """A launched server's cgroup holds the request's ``server_memory`` (at most the worker's FARM_SERVER_MEMORY);
    where no cgroup can be made the result says so."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with listener() as host_service, ProcessRunner().place(_spec(memory=256 << 20),
                                                           _probe_launch(model, host_service.port), None) as target:
        groups = Path(f"/proc/{target.pid}/cgroup").read_text()
        note = [n for n in target.notes if "memory not limited" in n]
        if note:
            pytest.skip(f"no cgroup on this host: {note[0]}")
        rel = next((line.split(":", 2)[2] for line in groups.splitlines() if ":memory:" in line or line.startswith(
            "0::")), None)
        assert rel is not None, groups
        for name in ("memory.max", "memory.limit_in_bytes"):
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")):
                f = root / rel.strip("/") / name
                if f.is_file():
                    assert int(f.read_text()) == 256 << 20
                    return
    pytest.fail(f"no memory limit file found for {groups}")

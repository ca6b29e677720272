"""The process runner serves a model whose loading runs code (TorchScript) in the bubblewrap jail, inside its
lease, with no secret of the worker's (issue 27 points 2-3); any server it starts gets the clean environment."""
from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from farm import sandbox
from farm.models.examples import build_example
from schemas import JobSpec, MeasurementSettings, TensorSpec
from workers.runners.process import ProcessRunner

pytestmark = pytest.mark.skipif(sandbox.jail_unavailable() is not None, reason=str(sandbox.jail_unavailable()))


def _spec(fmt: str, engine: str) -> JobSpec:
    return JobSpec(job_id="j" * 32, request_id="r", model_sha256="0" * 64, model_format=fmt,
                   inputs=[TensorSpec(name="input", shape=(256,))], device="cpu", engine=engine,
                   batch_size=1, concurrency=1, queue="farm.cpu", measurement=MeasurementSettings(threads=1))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.parametrize("fmt, engine, jailed", [("torchscript", "torchscript", True), ("onnx", "onnxruntime", False)])
def test_servers_get_no_secret_and_code_running_models_are_jailed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, engine: str, jailed: bool) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("FARM_DATABASE_URL", "postgresql://farm:worker-s3cret@db/farm")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cloud-k3y")
    model = build_example("torchscript-mlp" if fmt == "torchscript" else "mlp", tmp_path / f"m.{fmt}")
    cores = {sorted(psutil.Process().cpu_affinity() or [0])[0]}
    with ProcessRunner().serve(_spec(fmt, engine), model, cores) as target:
        assert target.pid is not None
        tree = [psutil.Process(target.pid), *psutil.Process(target.pid).children(recursive=True)]
        names = [p.name() for p in tree]
        assert ("bwrap" in names) is jailed, names
        server = next(p for p in tree if p.name() not in ("bwrap", "sh") and "workers.engines.server" in p.cmdline())
        env = _environ(server.pid)
        assert not any(k.startswith("FARM_") or k.startswith("AWS_") for k in env), sorted(env)
        assert "worker-s3cret" not in " ".join(env.values()) and env["HOME"] == "/tmp"
        for p in tree:  # the jail keeps the lease: every thread on the leased core
            assert set(p.cpu_affinity()) <= cores, (p.name(), p.cpu_affinity())
        for ns in ("mnt", "user", "pid"):  # the jail's own namespaces, or ours for a model that runs no code
            own = os.readlink(f"/proc/{server.pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
            assert own is jailed, ns

"""The trust model (issue 27 points 2, 3, 8): a hostile TorchScript file never writes on the host (farm analyze,
farm submit, a process-runner job), jobs never see the worker's secrets, the database never keeps them, and a
request's own edge command runs only where the operator allows it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from farm import sandbox
from farm.errors import SandboxError
from farm.sandbox import jail_argv
from farm.secrets import clean_env, scrub, secret_values
from farm.settings import reset_settings
from schemas import JobSpec
from workers.execute import refuse_command

needs_jail = pytest.mark.skipif(sandbox.jail_unavailable() is not None, reason=str(sandbox.jail_unavailable()))
REPO = Path(__file__).resolve().parents[2]
HOSTILE = '''
import sys
import torch

class Hostile(torch.nn.Module):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        written = torch.from_file(self.path, True, 16, dtype=torch.uint8)  # creates and maps a host file
        return x + written.sum().to(x.dtype)

torch.jit.save(torch.jit.script(Hostile(sys.argv[2])), sys.argv[1],
               _extra_files={"farm_inputs.json": '["x:FP32:4"]'})
'''


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A scripted module whose forward() writes ``marker`` on the host (torch.from_file, shared=True): (model,
    marker). Built with torch.jit.script."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("hostile")
    model, marker, script = d / "hostile.pt", d / "MARKER", d / "make_hostile.py"
    script.write_text(HOSTILE)  # torch.jit.script reads the class's source from its file
    subprocess.run([sys.executable, str(script), str(model), str(marker)], check=True, timeout=300)
    assert not marker.exists()
    return model, marker


def _farm(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True, env=full,
                          timeout=timeout)


# -- no secrets to jobs ---------------------------------------------------------------------------------------
def test_clean_env_keeps_the_allowlist_only() -> None:
    worker = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "2", "ORT_LOGGING": "3",
              "FARM_DATABASE_URL": "postgresql://farm:pw@db/farm", "AWS_SECRET_ACCESS_KEY": "k",
              "GITHUB_TOKEN": "t", "HOME": "/root", "PYTHONPATH": "/src"}
    env = clean_env({"CUDA_VISIBLE_DEVICES": "GPU-1"}, source=worker)
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "2", "ORT_LOGGING": "3",
                   "PYTHONPATH": "/src", "HOME": "/tmp", "CUDA_VISIBLE_DEVICES": "GPU-1"}


def test_scrub_masks_url_passwords_and_farm_secrets() -> None:
    worker = {"FARM_DATABASE_URL": "postgresql+psycopg2://farm:s3cret-pw@db:5432/farm",
              "FARM_BROKER_URL": "redis://:br0ker-pw@redis:6379/0", "FARM_API_TOKEN": "tok-12345",
              "FARM_RUNNER": "process"}
    secrets = secret_values(worker)
    assert "s3cret-pw" in secrets and "br0ker-pw" in secrets and "tok-12345" in secrets
    assert "process" not in secrets
    details = {"error": "connect postgresql+psycopg2://farm:s3cret-pw@db:5432/farm failed",
               "notes": ["token tok-12345", "redis br0ker-pw"], "n": 3,
               "other": "mysql://u:unknown-pw@h/x"}
    out = scrub(details, secrets)
    text_out = json.dumps(out)
    for secret in ("s3cret-pw", "br0ker-pw", "tok-12345", "unknown-pw"):
        assert secret not in text_out
    assert out["n"] == 3 and "***" in out["error"]


# -- hostile TorchScript --------------------------------------------------------------------------------------
@needs_jail
def test_hostile_torchscript_writes_nothing_on_analyze(hostile: tuple[Path, Path]) -> None:
    model, marker = hostile
    done = _farm("analyze", str(model), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "torchscript"
    assert not marker.exists(), "the model's code wrote on the host during farm analyze"


@needs_jail
def test_hostile_torchscript_writes_nothing_when_submit_refuses_the_request(hostile: tuple[Path, Path]) -> None:
    """farm submit checks the model (a dry run) before it finds that no job can run it: the dry run ran in the
    jail, so the refused request left nothing on the host either."""
    model, marker = hostile
    done = _farm("submit", str(model), "--engine", "onnxruntime", "--batch-sizes", "1", "--concurrency", "1")
    assert done.returncode == 2 and "no runnable job" in done.stderr, done.stderr
    assert not marker.exists(), "the model's code wrote on the host during farm submit's checks"


@needs_jail
def test_the_marker_test_detects_unsandboxed_loading(hostile: tuple[Path, Path]) -> None:
    """The operator's FARM_TRUSTED_MODELS=1 loads in-process: the same model then writes its marker, which
    shows the assertion above can fail (as it did before the sandbox)."""
    model, marker = hostile
    try:
        assert _farm("analyze", str(model), env={"FARM_TRUSTED_MODELS": "1"}).returncode == 0
        assert marker.exists()
    finally:
        marker.unlink(missing_ok=True)


def test_no_sandbox_refuses_code_running_models(hostile: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from farm.cli.main import main

    model, marker = hostile
    monkeypatch.setattr(sandbox, "jail_unavailable", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(model)])
    err = capsys.readouterr().err
    assert exc.value.code == 1, err
    assert "FARM_TRUSTED_MODELS=1" in err and "bubblewrap" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()
    with pytest.raises(SandboxError):
        sandbox.model_jail("torchscript", "hostile.pt")
    assert sandbox.model_jail("onnx", "m.onnx") is False  # ONNX runs no code from the file


@needs_jail
@pytest.mark.slow
def test_hostile_torchscript_writes_nothing_on_submit_and_process_runner_job(
        hostile: tuple[Path, Path], tmp_path: Path) -> None:
    """farm submit's checks (inspection, analysis) and the process runner's server (its dry run and every
    request) all load the model: none of them writes the marker. (In the jail the model's write may fail, and
    its job with it: either way the job ran and the host holds no marker.)"""
    model, marker = hostile
    done = _farm("submit", str(model), "--engine", "torchscript", "--batch-sizes", "1", "--concurrency", "1",
                 "--duration", "1", "--json", env={"FARM_RUNNER": "process"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    statuses = [r["status"] for r in (rows["results"] if isinstance(rows, dict) else rows)]
    assert len(statuses) == 1 and statuses[0] in ("succeeded", "failed"), done.stdout
    assert statuses[0] == "succeeded" or "TorchScript interpreter" in done.stdout, done.stdout  # the model ran
    assert not marker.exists(), "the model's code wrote on the host during farm submit or its job"


# -- request commands -----------------------------------------------------------------------------------------
def _edge_request(tmp_path: Path, model: Path) -> Path:
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"model": str(model), "engines": ["onnxruntime"], "batch_sizes": [1],
                               "concurrency": [1], "edge": [{"name": "box", "cpus": 1, "memory": "512m", "command": [
                                   "sh", "-c", "env >&2; echo url=$FARM_DATABASE_URL >&2; "
                                   "echo also hunter2-db-pw tok-abcdef-123 >&2; exit 3"]}]}))
    return req


def test_edge_command_refused_up_front_without_allow_commands(tmp_path: Path, example_onnx: Path) -> None:
    done = _farm("submit", "-f", str(_edge_request(tmp_path, example_onnx)))
    assert done.returncode == 1, done.stderr
    assert "FARM_ALLOW_COMMANDS=1" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_a_worker_refuses_a_request_command(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = JobSpec.model_validate({
        "job_id": "j" * 16, "request_id": "r", "model_sha256": "0" * 64, "model_filename": "m.onnx",
        "model_format": "onnx", "engine": "onnxruntime", "device": "cpu", "batch_size": 1, "concurrency": 1,
        "queue": "farm.edge", "measurement": {}, "inputs": [{"name": "input", "dtype": "FP32", "shape": [256]}],
        "edge_profile": {"name": "box", "cpus": 1, "memory": "512m", "command": ["sh", "-c", "env"]}})
    with pytest.raises(SandboxError, match="--allow-commands"):
        refuse_command(spec)
    monkeypatch.setenv("FARM_ALLOW_COMMANDS", "1")  # the operator's consent, as farm worker --allow-commands gives
    reset_settings()
    refuse_command(spec)  # no error
    refuse_command(spec.model_copy(update={"edge_profile": None}))  # a served job brings no command


@pytest.mark.slow
def test_allowed_edge_command_sees_no_secret_and_none_is_stored(tmp_path: Path, example_onnx: Path,
                                                                pg_url: str) -> None:
    """With the operator's consent the command runs, with the clean environment; what it prints (here the
    database password it could only have guessed) is scrubbed before jobs.error and results.details."""
    from farm.db.migrate import upgrade

    url = pg_url.replace("postgres@", "postgres:hunter2-db-pw@", 1)  # the server trusts; the password is a secret
    assert "hunter2-db-pw" in url
    upgrade(url)
    env = {"FARM_DATABASE_URL": url, "FARM_ALLOW_COMMANDS": "1", "FARM_RUNNER": "process",
           "FARM_API_TOKEN": "tok-abcdef-123"}
    done = _farm("submit", "-f", str(_edge_request(tmp_path, example_onnx)), "--json", env=env, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT j.error, CAST(r.details AS TEXT) FROM jobs j JOIN results r ON "
                                 "r.job_id = j.id WHERE j.edge_profile IS NOT NULL")).all()
    engine.dispose()
    assert rows, "the edge job left no row"
    stored = " ".join(str(v) for row in rows for v in row)
    assert "exit" in stored or "3" in stored
    assert "url=" in stored  # the command ran, and its stderr was kept
    for secret in ("hunter2-db-pw", "tok-abcdef-123", "FARM_API_TOKEN", "FARM_DATABASE_URL=postgres"):
        assert secret not in stored, f"{secret} reached the database"


# -- scrubbing on the write path ------------------------------------------------------------------------------
def test_a_finished_jobs_error_and_details_are_scrubbed_when_written(sqlite_url: str, example_onnx: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a job printed, ``jobs.error`` and ``results.details`` keep no secret of the worker's: the one
    write of a job's end (lifecycle._settle) masks them, for the worker's path and reconciliation's alike."""
    from farm import lifecycle
    from farm.db.models import Job, Result
    from farm.db.session import session_scope
    from scheduler.enqueue import submit
    from schemas import JobResult, ProfileRequest
    from schemas.job import JobStatus

    monkeypatch.setenv("FARM_BROKER_PASSWORD", "br0ker-s3cret")
    monkeypatch.setenv("FARM_CLOUD_URL", "https://svc:cl0ud-pw@example.invalid/x")
    leak = "stderr: br0ker-s3cret https://svc:cl0ud-pw@example.invalid/x postgresql://u:other-pw@db/x"
    ids = [j.job_id for j in submit(ProfileRequest(model=str(example_onnx), batch_sizes=[1, 2]),
                                    send=False).expansion.jobs]
    with session_scope() as s:
        spec = lifecycle.claim(s, ids[0], "w1")
        assert spec is not None
        result = JobResult(job_id=ids[0], details={"error": leak, "notes": [leak], "stdout": {"tail": leak}})
        assert lifecycle.finish(s, spec, "w1", result, JobStatus.failed, leak)
        assert lifecycle.fail(s, ids[1], spec.request_id, leak, None, statuses=(JobStatus.queued,))
    with session_scope() as s:
        stored = json.dumps([[s.get(Job, i).error, s.get(Result, i).details] for i in ids])  # type: ignore[union-attr]
    for secret in ("br0ker-s3cret", "cl0ud-pw", "other-pw"):
        assert secret not in stored
    assert stored.count("***") >= 8


def test_farm_worker_allow_commands_is_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``farm worker --allow-commands`` turns FARM_ALLOW_COMMANDS on for the worker and its slot processes (here
    the worker then stops: no broker is set)."""
    from farm.cli.main import main
    from farm.settings import get_settings

    monkeypatch.setenv("FARM_ALLOW_COMMANDS", "0")  # restored after the test
    reset_settings()
    with pytest.raises(SystemExit):
        main(["worker", "--allow-commands"])
    assert "needs a broker" in capsys.readouterr().err
    assert os.environ["FARM_ALLOW_COMMANDS"] == "1" and get_settings().allow_commands is True


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_jail_sees_the_libraries_on_the_workers_ld_library_path(tmp_path: Path) -> None:
    """A GPU node's driver libraries often live on LD_LIBRARY_PATH (libnvidia-ml in /usr/local/nvidia/lib64): a
    jailed server must see them, read-only, or NVML and CUDA fail to load in it."""
    lib = tmp_path / "driver-libs"
    lib.mkdir()
    (lib / "libfake.so").write_text("x")
    env = {**clean_env(), "LD_LIBRARY_PATH": f"{lib}{os.pathsep}relative{os.pathsep}/nonexistent"}
    code = ("import os, sys; p = os.path.join(os.environ['LD_LIBRARY_PATH'].split(os.pathsep)[0], 'libfake.so'); "
            "print(open(p).read()); open(p, 'a')")
    done = subprocess.run(jail_argv([sys.executable, "-c", code], network=False, env=env), capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "x", done.stderr[-2000:]  # seen
    assert done.returncode != 0 and "Read-only file system" in done.stderr  # and read-only

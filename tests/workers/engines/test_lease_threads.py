"""Every thread of every engine's server stays inside its job's core lease (issue 31): a real built-in server
per engine on a 1-core lease (the process runner), its threads' affinities read from /proc, its intra-op
thread count as the server reports it; and the check that refuses to measure when a thread is outside."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from farm.errors import LeaseError
from schemas import JobSpec, MeasurementSettings, TensorSpec
from schemas.cpus import cpu_list
from tests.workers.engines.conftest import ROOT
from workers.cores import pinned
from workers.engines.backends import make_backend
from workers.limits import LimitedCgroup
from workers.runners import process
from workers.runners.process import ProcessRunner
from workers.serving import confine
from workers.serving.base import ServingTarget
from workers.serving.confine import ThreadCpus, check_threads, server_pids, thread_cpus

CORES = sorted(os.sched_getaffinity(0))
ONE = {CORES[0]}
FORMAT = {"onnxruntime": "onnx", "openvino": "onnx", "torchscript": "torchscript"}
THREAD_PARAM = {"onnx": "intra_op_thread_count", "torchscript": "INTRA_OP_THREAD_COUNT"}


@pytest.fixture(scope="module")
def torchscript_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    path = tmp_path_factory.mktemp("lease") / "mlp.pt"
    torch.jit.script(net).save(str(path))
    return path


def _spec(engine: str, threads: int = 0) -> JobSpec:
    return JobSpec(job_id="l" * 32, request_id="r", model_sha256="0" * 64, model_format=FORMAT[engine],
                   inputs=[TensorSpec(name="x" if engine != "torchscript" else "input", shape=(16,))], device="cpu",
                   engine=engine, batch_size=1, concurrency=1, queue="farm.cpu",
                   measurement=MeasurementSettings(threads=threads))


def _model(engine: str, mlp_onnx: Path, torchscript_model: Path | None) -> Path:
    if engine == "openvino":
        pytest.importorskip("openvino")
    return torchscript_model if engine == "torchscript" and torchscript_model else mlp_onnx


def _intra_op_threads(target: ServingTarget, model_format: str) -> int:
    """The intra-op threads per instance the server reports in its ModelConfig."""
    import tritonclient.grpc as tc

    cfg = tc.InferenceServerClient(target.url).get_model_config(target.model_name).config
    return int(cfg.parameters[THREAD_PARAM[model_format]].string_value)


def _infer(target: ServingTarget, name: str) -> None:
    """One inference, so that pools an engine starts on first use (torch's) exist when threads are read."""
    import tritonclient.grpc as tc

    i = tc.InferInput(name, [4, 16], "FP32")
    i.set_data_from_numpy(np.ones((4, 16), np.float32))
    tc.InferenceServerClient(target.url).infer(target.model_name, [i])


class Refused(LimitedCgroup):
    """A cgroup this host does not allow: the process runner falls back to sched_setaffinity."""

    def __enter__(self) -> Refused:
        self.reason = "no permission to create cgroups (test)"
        return self


@pytest.mark.parametrize("engine", ["onnxruntime", "torchscript", "openvino"])
def test_every_thread_of_a_real_server_stays_in_a_1_core_lease(
        engine: str, mlp_onnx: Path, request, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a cgroup cpuset (which would hold every thread whatever the engine does), so that the engine's
    own settings are what keeps its threads in: with ONNX Runtime's default, one pool thread ran on the other
    core."""
    ts = request.getfixturevalue("torchscript_model") if engine == "torchscript" else None
    model = _model(engine, mlp_onnx, ts)
    spec = _spec(engine)
    monkeypatch.setattr(process, "LimitedCgroup", Refused)
    with ProcessRunner().serve(spec, model, ONE) as target:  # serve itself refuses a thread outside ONE
        _infer(target, spec.inputs[0].name)
        pids, why = server_pids(target)
        threads = thread_cpus(pids)
        assert why is None and len(threads) >= 2
        assert {t.cpus for t in threads} == {frozenset(ONE)}, [t.describe() for t in threads]
        assert _intra_op_threads(target, spec.model_format) == 1
        assert len(check_threads(target, ONE)) >= len(threads)


def test_intra_op_threads_follow_the_lease_and_an_explicit_knob_wins(mlp_onnx: Path) -> None:
    if len(CORES) < 2:
        pytest.skip("needs 2 cores")
    two = set(CORES[:2])
    with ProcessRunner().serve(_spec("onnxruntime"), mlp_onnx, two) as target:
        assert _intra_op_threads(target, "onnx") == 2
        assert all(t.cpus <= two for t in thread_cpus(server_pids(target)[0]))
    with ProcessRunner().serve(_spec("onnxruntime", threads=3), mlp_onnx, ONE) as target:
        assert _intra_op_threads(target, "onnx") == 3  # as the user asked; still all on the one core
        assert {t.cpus for t in thread_cpus(server_pids(target)[0])} == {frozenset(ONE)}


@pytest.mark.parametrize("engine", ["onnxruntime", "torchscript", "openvino"])
def test_a_backend_left_at_threads_0_takes_one_thread_per_core_it_may_run_on(
        engine: str, mlp_onnx: Path, request) -> None:
    """The engine's own reading of its thread count, in this process pinned to one core."""
    ts = request.getfixturevalue("torchscript_model") if engine == "torchscript" else None
    model = _model(engine, mlp_onnx, ts)
    with pinned(ONE), make_backend(engine) as b:
        if engine != "torchscript":
            b.load(model, "cpu", threads=0)
        if engine == "onnxruntime":
            opts = b._sess.get_session_options()  # type: ignore[attr-defined]
            assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)
        elif engine == "openvino":
            compiled = b._request.get_compiled_model()  # type: ignore[attr-defined]
            assert int(compiled.get_property("INFERENCE_NUM_THREADS")) == 1
            assert compiled.get_property("ENABLE_CPU_PINNING") is False
        else:  # torch's thread counts are per process, its inter-op count settable once: read in a fresh one
            code = ("import os, sys, torch\n"
                    "from workers.engines.backends import make_backend\n"
                    f"os.sched_setaffinity(0, {ONE!r})\n"
                    "make_backend('torchscript').load(sys.argv[1], 'cpu', 0)\n"
                    "print(torch.get_num_threads(), torch.get_num_interop_threads())\n")
            out = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True,
                                 timeout=120, check=True, cwd=ROOT).stdout.split()
            assert out == ["1", "1"]


@contextmanager
def _widened_thread() -> Iterator[tuple[int, int]]:
    """A process pinned to ONE whose one extra thread widens its own affinity to every core (as an engine
    that pins its pool itself does); yields (pid, that thread's id)."""
    code = ("import os, sys, threading\n"
            f"os.sched_setaffinity(0, {ONE!r})\n"
            "def run():\n"
            f"    os.sched_setaffinity(threading.get_native_id(), {set(CORES)!r})\n"
            "    print(threading.get_native_id(), flush=True)\n"
            "    sys.stdin.read()\n"
            "threading.Thread(target=run).start()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.pid, int(proc.stdout.readline())
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_the_check_refuses_a_real_thread_outside_the_lease() -> None:
    if len(CORES) < 2:
        pytest.skip("needs 2 cores")
    with _widened_thread() as (pid, tid):
        with pytest.raises(LeaseError) as info:
            check_threads(ServingTarget(host="127.0.0.1", port=1, model_name="m", pid=pid), ONE)
    msg = str(info.value)
    assert f"thread {tid} " in msg and f"of process {pid} may run on cpus {cpu_list(CORES)}" in msg
    assert f"outside the job's lease (cpus {cpu_list(ONE)})" in msg and "refuses to measure" in msg
    assert "explicit threads" in msg and "\n" not in msg


def test_a_thread_outside_the_lease_fails_the_job_with_the_error_on_its_row(
        sqlite_url: str, example_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's real path (run_job, a real server on its lease) with the thread reader widening one
    thread's affinity: the job ends failed, its row saying which thread and what to do."""
    from farm.db.models import Job
    from farm.db.session import session_scope
    from farm.settings import reset_settings
    from scheduler.enqueue import submit
    from schemas import ProfileRequest
    from schemas.job import JobStatus
    from workers import execute

    monkeypatch.setenv("FARM_HOST_LOCK_DIR", str(tmp_path / "locks"))
    reset_settings()
    real = confine.thread_cpus

    def widened(pids: object, proc: Path = confine.PROC) -> list[ThreadCpus]:
        threads = real(pids, proc)  # type: ignore[arg-type]
        t = threads[-1]
        return [*threads[:-1], ThreadCpus(t.pid, t.tid, "ort-pool", frozenset({*t.cpus, max(CORES) + 1}))]

    monkeypatch.setattr(confine, "thread_cpus", widened)
    job_id = submit(ProfileRequest(model=str(example_onnx)), send=False).expansion.jobs[0].job_id
    assert execute.run_job(job_id, "w1", ProcessRunner()) == JobStatus.failed
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.error is not None
        assert "(ort-pool) of process" in job.error and "outside the job's lease" in job.error
        assert "refuses to measure" in job.error


def test_the_process_runner_holds_the_server_in_a_cpuset_or_says_it_could_not(
        mlp_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with LimitedCgroup(cpuset_cpus=cpu_list(ONE)) as probe:
        can = probe.enforced
    with ProcessRunner().serve(_spec("onnxruntime", threads=1), mlp_onnx, ONE) as target:
        assert target.pid is not None
        cgroups = Path(f"/proc/{target.pid}/cgroup").read_text()
        if can:
            assert target.notes == []
            assert any("cpuset" in line and "/farm" in line or line.startswith("0::/farm/")
                       for line in cgroups.splitlines()), cgroups
    monkeypatch.setattr(process, "LimitedCgroup", Refused)
    with ProcessRunner().serve(_spec("onnxruntime", threads=1), mlp_onnx, ONE) as target:
        assert any("by sched_setaffinity only" in n and "no permission to create cgroups (test)" in n
                   for n in target.notes), target.notes
        assert {t.cpus for t in thread_cpus(server_pids(target)[0])} == {frozenset(ONE)}

"""Slots: one per GPU (or per ``--gpus``), each bound to its GPU by UUID, consuming its product's queue; a real
``farm worker`` on a host whose fake ``libnvidia-ml`` reports 3 GPUs (2 A100, 1 T4) runs 3 slot processes
that take jobs at the same time, each on its own GPU."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from farm.db.models import Job, Result, Worker
from farm.db.session import session_scope
from farm.errors import ConfigError, ServerError
from farm.secrets import clean_env
from schemas import CpuInfo, GpuInfo, JobSpec, MeasurementSettings, TensorSpec, WorkerHardware
from schemas.queues import CPU_QUEUE, EDGE_QUEUE, gpu_queue
from tests.helpers import farm, farm_env
from tests.workers.samplers.conftest import fake_nvml_dir, run_py, write_state  # noqa: F401  (fake NVML fixture)
from tests.workers.samplers.test_hardware import TWO_PRODUCTS
from workers.hardware import queues_for
from workers.runners.process import ProcessRunner, server_env
from workers.serving import builtin as builtin_server
from workers.slots import build_slots, select_gpus, slot_worker_id

UUIDS = [f"GPU-{d * 8}-aaaa-bbbb-cccc-000000000000" for d in "123"]
A100, T4 = "a100-sxm4-40gb", "t4"


def _gpu(i: int, name: str, slug: str) -> GpuInfo:
    return GpuInfo(index=i, uuid=UUIDS[i], name=name, slug=slug, memory_total_bytes=1 << 34)


GPUS = [_gpu(0, "NVIDIA A100-SXM4-40GB", A100), _gpu(1, "NVIDIA A100-SXM4-40GB", A100), _gpu(2, "Tesla T4", T4)]


def _hardware(gpus: list[GpuInfo], queues: list[str] | None = None) -> WorkerHardware:
    cpu = CpuInfo(model="x", logical_cores=2, memory_bytes=1 << 30, arch="x86_64")
    return WorkerHardware(hostname="h", cpu=cpu, gpus=gpus, queues=queues or queues_for(cpu, gpus))


def _spec(device: str) -> JobSpec:
    return JobSpec(job_id="s" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx", batch_size=1,
                   concurrency=1, inputs=[TensorSpec(name="input", shape=(4,))], device=device,
                   engine="onnxruntime", queue=gpu_queue(device[4:]) if device != "cpu" else CPU_QUEUE,
                   measurement=MeasurementSettings())


def test_one_slot_per_gpu_bound_by_uuid_each_on_its_products_queue() -> None:
    slots = build_slots(_hardware(GPUS))
    assert [(s.index, s.gpu_uuid, s.gpu_index) for s in slots] == [(0, UUIDS[0], 0), (1, UUIDS[1], 1),
                                                                    (2, UUIDS[2], 2)]
    assert [s.queues for s in slots] == [(gpu_queue(A100), CPU_QUEUE, EDGE_QUEUE), (gpu_queue(A100),),
                                         (gpu_queue(T4),)]
    assert [s.env() for s in slots] == [{"CUDA_VISIBLE_DEVICES": u} for u in UUIDS]
    assert slots[2].hardware(_hardware(GPUS)).gpus == [GPUS[2]]
    assert slot_worker_id("w-1", slots[2]) == "w-1-s2"


def test_gpus_option_picks_slots_by_index_or_uuid() -> None:
    slots = build_slots(_hardware(GPUS), "0,2")
    assert [(s.index, s.gpu_uuid) for s in slots] == [(0, UUIDS[0]), (1, UUIDS[2])]
    assert [g.index for g in select_gpus(GPUS, UUIDS[1])] == [1]
    with pytest.raises(ConfigError, match=r"no GPU '5'.*0 \(NVIDIA A100"):
        build_slots(_hardware(GPUS), "0,5")
    with pytest.raises(ConfigError, match="named twice"):
        build_slots(_hardware(GPUS), "1,1")


def test_a_host_without_gpus_or_serving_no_gpu_queue_has_one_cpu_slot() -> None:
    (cpu,) = build_slots(_hardware([]))
    assert (cpu.index, cpu.gpu, cpu.queues, cpu.env()) == (0, None, (CPU_QUEUE, EDGE_QUEUE), {})
    (only,) = build_slots(_hardware(GPUS, [CPU_QUEUE]))
    assert (only.gpu, only.queues) == (None, (CPU_QUEUE,))


def test_slots_are_built_from_the_fake_nvml_devices(fake_nvml_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS)
    out = run_py("import json; from workers.hardware import detect_hardware; from workers.slots import build_slots\n"
                 "print(json.dumps([s.describe() for s in build_slots(detect_hardware(docker=False))]))",
                 fake_nvml_dir, state)
    assert [(s["index"], s["gpu_uuid"], s["product"]) for s in out] == [
        (0, "GPU-11111111-aaaa-bbbb-cccc-000000000000", A100), (1, "GPU-22222222-aaaa-bbbb-cccc-000000000000", A100),
        (2, "GPU-33333333-aaaa-bbbb-cccc-000000000000", T4)]


NVML_OF_SLOT = """
import json
from schemas import JobSpec, MeasurementSettings, TensorSpec
from workers.hardware import detect_hardware
from workers.measure import Measurement
from workers.node import WorkerNode
from workers.runners.process import ProcessRunner
from workers.slots import build_slots

hw = detect_hardware(docker=False)
out = {}
for slot in build_slots(hw):
    node = WorkerNode(runner=ProcessRunner(gpus=slot.gpus), hardware=hw, slot=slot, worker_id=f"w-s{slot.index}")
    for device in ("gpu:a100-sxm4-40gb", "gpu:t4"):
        spec = JobSpec(job_id="n" * 32, request_id="r", model_sha256="0" * 64, model_format="onnx",
                       batch_size=1, concurrency=1, inputs=[TensorSpec(name="input", shape=(4,))], device=device,
                       engine="onnxruntime", queue="q", measurement=MeasurementSettings())
        uuids = node.gpu_uuids_for(device)
        with Measurement(spec, uuids) as m:
            opened = m.gpu.gpu_uuids if m.gpu is not None else []
            handles = len(m.gpu._handles) if m.gpu is not None else 0
        out[f"{slot.index} {device}"] = [opened, handles, node.registered_hardware()["slot"]["gpu_uuid"]]
print(json.dumps(out))
"""


def test_each_slot_samples_only_its_own_gpu_through_nvml(fake_nvml_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS)
    out = run_py(NVML_OF_SLOT, fake_nvml_dir, state)
    u1, u2, u3 = (f"GPU-{d * 8}-aaaa-bbbb-cccc-000000000000" for d in "123")
    assert out == {f"0 gpu:{A100}": [[u1], 1, u1], f"0 gpu:{T4}": [[], 0, u1],
                   f"1 gpu:{A100}": [[u2], 1, u2], f"1 gpu:{T4}": [[], 0, u2],
                   f"2 gpu:{A100}": [[], 0, u3], f"2 gpu:{T4}": [[u3], 1, u3]}


FAKE_SERVER = """import os, sys
open(sys.argv[1], "w").write(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
print("farm-serve listening 127.0.0.1:1", flush=True)
"""


def test_the_process_runner_starts_a_gpu_jobs_server_on_its_slots_gpu_only(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    script, seen = tmp_path / "fake_server.py", tmp_path / "env.txt"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(builtin_server, "job_argv", lambda spec, model, site: [sys.executable, str(script), str(seen)])
    slot = build_slots(_hardware(GPUS))[1]
    with pytest.raises(ServerError), ProcessRunner(gpus=slot.gpus).serve(_spec(f"gpu:{A100}"), tmp_path):
        pass  # the fake server exits once it has written its environment
    assert seen.read_text() == UUIDS[1]
    assert server_env(_spec("cpu"), slot.gpus) == clean_env()  # CPU jobs: the clean environment, no GPU pinned
    with pytest.raises(ServerError, match="no such GPU"):
        server_env(_spec(f"gpu:{T4}"), slot.gpus)


def _wait(what: str, check: object, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _online_slots() -> list[Worker]:
    with session_scope() as s:
        return list(s.execute(select(Worker).where(Worker.status == "online")).scalars())


def test_a_worker_runs_one_slot_process_per_gpu_and_they_measure_at_once(
        cluster_env: dict[str, str], example_onnx: Path, fake_nvml_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    from scheduler.enqueue import submit
    from schemas import ProfileRequest

    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS)
    env = farm_env(**cluster_env, FARM_NOOP_JOBS="1", FARM_NOOP_SLEEP_S="2", LD_LIBRARY_PATH=str(fake_nvml_dir),
                   FAKE_NVML_STATE=str(state), FARM_HEARTBEAT_S="0.5")
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "farm", "worker", "--worker-id", "gpuhost"], env=env,
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait("3 slots online and consuming",
              lambda: len(_online_slots()) == 3 and log.read_text().count(" ready.") >= 3)
        children = {p.pid: p.environ().get("CUDA_VISIBLE_DEVICES") for p in psutil.Process(worker.pid).children()}
        assert sorted(children.values()) == sorted(f"GPU-{d * 8}-aaaa-bbbb-cccc-000000000000" for d in "123")
        sub = submit(ProfileRequest(model=str(example_onnx), devices=[f"gpu:{A100}", f"gpu:{T4}"], batch_sizes=[1, 2]))
        ids = [j.job_id for j in sub.expansion.jobs]
        table = farm("workers", env=env).stdout
        _wait("the jobs", lambda: _finished(ids) == len(ids))
        listed = json.loads(farm("workers", "--json", env=env).stdout)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=120)
    assert code == 0, log.read_text()[-3000:]
    with session_scope() as s:
        jobs = {j.id: j for j in s.execute(select(Job).where(Job.id.in_(ids))).scalars()}
        placement = {r.job_id: {"slot": r.slot, "gpu_uuid": r.gpu_uuid} for r in s.execute(select(Result)).scalars()}
        rows = {w.id: w for w in s.execute(select(Worker)).scalars()}
    assert set(rows) == {"gpuhost-s0", "gpuhost-s1", "gpuhost-s2"}
    assert all(w.status == "offline" for w in rows.values())
    for job in jobs.values():
        slot = rows[job.worker_id].hardware["slot"]
        assert job.status == "succeeded" and job.device == f"gpu:{slot['product']}"
        assert placement[job.id] == {"slot": slot["index"], "gpu_uuid": slot["gpu_uuid"]}
    a100 = sorted((j for j in jobs.values() if j.device == f"gpu:{A100}"), key=lambda j: j.started_at)
    assert len(a100) == 2 and a100[0].worker_id != a100[1].worker_id  # both A100 slots took one
    assert a100[1].started_at < a100[0].finished_at  # ... and ran them at the same time
    assert {j.worker_id for j in jobs.values() if j.device == f"gpu:{T4}"} == {"gpuhost-s2"}
    assert sorted(w["slot"]["index"] for w in listed) == [0, 1, 2]
    assert {w["slot"]["gpu_uuid"]: w["gpus"] for w in listed}[UUIDS[2]] == ["Tesla T4"]
    assert "slot" in table and "gpuhost-s2" in table


def _finished(ids: list[str]) -> int:
    with session_scope() as s:
        return len(s.execute(select(Job.id).where(Job.id.in_(ids), Job.status.in_(
            ["succeeded", "failed", "cancelled"]))).all())


def test_an_unknown_gpu_is_a_usage_error(cluster_env: dict[str, str], fake_nvml_dir: Path,  # noqa: F811
                                         tmp_path: Path) -> None:
    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS)
    proc = farm("worker", "--gpus", "0,7", "--burst", check=False,
                env=farm_env(**cluster_env, LD_LIBRARY_PATH=str(fake_nvml_dir), FAKE_NVML_STATE=str(state)))
    assert proc.returncode == 2, proc.stderr
    assert "no GPU '7'" in proc.stderr and "internal error" not in proc.stderr


def test_a_burst_worker_drains_every_slots_queue_and_exits(cluster_env: dict[str, str], example_onnx: Path,
                                                           fake_nvml_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    from farm.db.models import utcnow
    from scheduler.enqueue import submit
    from schemas import ProfileRequest

    gpus = [{"name": "NVIDIA A100-SXM4-40GB"}, {"name": "Tesla T4"}]
    with session_scope() as s:  # a GPU worker seen online, so the request's GPU jobs are planned and queued
        s.add(Worker(id="planner", hostname="elsewhere", hardware={"gpus": gpus}, queues=[], status="online",
                     last_heartbeat=utcnow()))
    sub = submit(ProfileRequest(model=str(example_onnx), devices=[f"gpu:{A100}", f"gpu:{T4}"], batch_sizes=[1, 2]))
    with session_scope() as s:
        s.delete(s.get(Worker, "planner"))
    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS)
    proc = farm("worker", "--burst", "--gpus", "1,2", "--worker-id", "burst", timeout=240,
                env=farm_env(**cluster_env, FARM_NOOP_JOBS="1", FARM_NOOP_SLEEP_S="1",
                             LD_LIBRARY_PATH=str(fake_nvml_dir), FAKE_NVML_STATE=str(state)))
    assert "2 slots" in proc.stderr and proc.stderr.count("burst: handled 2 message(s)") == 2, proc.stderr[-3000:]
    with session_scope() as s:
        jobs = list(s.execute(select(Job).where(Job.request_id == sub.request_id)).scalars())
        placement = {r.job_id: {"slot": r.slot, "gpu_uuid": r.gpu_uuid} for r in s.execute(select(Result)).scalars()}
    assert len(jobs) == 4 and all(j.status == "succeeded" for j in jobs)
    for j in jobs:  # --gpus 1,2: slot 0 is GPU 1 (an A100), slot 1 is GPU 2 (the T4)
        want = (0, UUIDS[1], "burst-s0") if j.device == f"gpu:{A100}" else (1, UUIDS[2], "burst-s1")
        assert (placement[j.id]["slot"], placement[j.id]["gpu_uuid"], j.worker_id) == want


def test_a_slot_process_that_dies_stops_its_worker(cluster_env: dict[str, str], fake_nvml_dir: Path,  # noqa: F811
                                                   tmp_path: Path) -> None:
    state = tmp_path / "nvml.state"
    write_state(state, TWO_PRODUCTS)
    env = farm_env(**cluster_env, LD_LIBRARY_PATH=str(fake_nvml_dir), FAKE_NVML_STATE=str(state))
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "farm", "worker", "--gpus", "0,2", "--worker-id", "dies"],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait("2 slots consuming", lambda: len(_online_slots()) == 2 and log.read_text().count(" ready.") >= 2)
        first, second = sorted(psutil.Process(worker.pid).children(), key=lambda p: p.pid)
        first.kill()
        code = worker.wait(timeout=120)  # the supervisor stops the other slot and exits with the dead one's code
    finally:
        if worker.poll() is None:
            worker.kill()
    assert code == 128 + signal.SIGKILL, log.read_text()[-3000:]
    assert not second.is_running() or second.status() == psutil.STATUS_ZOMBIE
    with session_scope() as s:
        rows = {w.id: w.status for w in s.execute(select(Worker)).scalars()}
    assert rows["dies-s1"] == "offline"  # the surviving slot shut down cleanly and said so

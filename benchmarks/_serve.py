"""Shared by the measurement benchmarks: test models built with onnx.helper, farm's server as a
context manager, CPU pinning. Nothing here asserts; benchmarks print figures."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

START_TIMEOUT_S = 60.0


def stored_upload(kind: str, path: Path, home: Path) -> dict[str, object]:
    """``path`` uploaded as a request's ``kind`` file (``farm.workload_files``) into an embedded database under ``home``
    (this process's ``FARM_HOME`` from now on); its reference, for ``measurement.llm`` (a job reads only uploads)."""
    # farm's database side, only for the benchmarks that upload a request's file (the others never import it)
    from farm import workload_files  # noqa: PLC0415
    from farm.db.migrate import upgrade  # noqa: PLC0415
    from farm.db.session import session_scope  # noqa: PLC0415
    from farm.settings import get_settings, reset_settings  # noqa: PLC0415

    os.environ["FARM_HOME"] = str(home)
    os.environ.pop("FARM_DATABASE_URL", None)
    reset_settings()
    home.mkdir(parents=True, exist_ok=True)
    upgrade(get_settings().db_url)
    up = workload_files.upload(kind, str(path))
    with session_scope() as s:
        workload_files.store(s, [up])
    return up.ref.model_dump()


def cpus() -> list[int]:
    """The CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0))


def split_cpus() -> tuple[set[int] | None, set[int] | None]:
    """(client CPUs, server CPUs): one half each, or (None, None) on a single CPU (no pinning)."""
    all_cpus = cpus()
    if len(all_cpus) < 2:
        return None, None
    half = len(all_cpus) // 2
    return set(all_cpus[:half]), set(all_cpus[half:])


def pin(cpu_set: set[int] | None) -> None:
    """Pin this process (all its threads created later) to ``cpu_set``; None leaves it as is."""
    if cpu_set:
        os.sched_setaffinity(0, cpu_set)


def machine_speed(cpu_sets: list[set[int] | None], seconds: float) -> tuple[float, float]:
    """The machine's own speed over ``seconds``: ``host_noise.py``'s two fixed workloads (a counting loop,
    a random gather over 16 MB) in one process per CPU set, all at once, as a job keeps client and server
    busy together. Returns the mean (loop M it/s, gather M elements/s). Taken right after a job for as
    long as the job measured, their spread across jobs is the floor no harness can go under here."""
    import subprocess

    script = str(Path(__file__).with_name("host_noise.py"))
    procs = [subprocess.Popen([sys.executable, script, "--once", str(seconds), "--cpus",
                               ",".join(map(str, sorted(c or [])))], stdout=subprocess.PIPE, text=True)
             for c in cpu_sets]
    rates = np.array([[float(v) for v in p.communicate()[0].split()] for p in procs])
    return float(rates[:, 0].mean()), float(rates[:, 1].mean())


def steal_flag(pct: float) -> str:
    """A marker to append to a figure line taken while the hypervisor took ``pct`` % of the CPU time:
    empty up to farm's own note threshold (``STEAL_NOTE_PCT``), a warning above it."""
    from workers.samplers.host import STEAL_NOTE_PCT

    return (f"  <- above {STEAL_NOTE_PCT:g} %: these figures measure the host as much as farm"
            if pct > STEAL_NOTE_PCT else "")


class Steal:
    """``with Steal() as st: ...`` then ``st.pct``: the share (%) of the machine's CPU time the hypervisor
    took meanwhile (NaN where the kernel does not say). Figures taken under heavy steal are noise."""

    def __init__(self) -> None:
        self.pct = float("nan")

    def __enter__(self) -> Steal:
        from workers.samplers.host import read_steal

        self._first = read_steal()
        return self

    def __exit__(self, *exc: object) -> None:
        from workers.samplers.host import read_steal, steal_pct

        last = read_steal()
        if self._first is not None and last is not None:
            pct = steal_pct(self._first, last)
            self.pct = float("nan") if pct is None else pct


def identity_model(path: Path, shape: tuple[int, ...]) -> Path:
    """ONNX Identity, input ``x`` FP32 ``[batch, *shape]``, output ``y``."""
    import onnx
    from onnx import TensorProto, helper

    dims: list[int | str] = ["batch", *shape]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def matmul_chain_model(path: Path, layers: int, dim: int) -> Path:
    """ONNX chain of ``layers`` MatMuls: ``x`` FP32 ``[batch, dim, dim]`` times ``dim x dim`` weights
    (scaled so values stay bounded), output ``y`` of the same shape."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out]))
        prev = out
    dims: list[int | str] = ["batch", dim, dim]
    graph = helper.make_graph(nodes, "matmul_chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@contextmanager
def farm_server(model: Path, threads: int = 1, instances: int = 1,
                cpu_set: set[int] | None = None, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """farm's built-in server for ``model`` (served as ``schemas.engines.SERVED_MODEL_NAME``), pinned to
    ``cpu_set``, with ``extra`` server options (e.g. ``--max-queue-delay-us 500``); yields ``host:port`` once
    ready and always stops it."""
    with farm_server_pid(model, threads, instances, cpu_set, extra) as (url, _):
        yield url


@contextmanager
def farm_server_pid(model: Path, threads: int = 1, instances: int = 1, cpu_set: set[int] | None = None,
                    extra: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """:func:`farm_server`, yielding ``(host:port, server pid)`` (for samplers watching it)."""
    from schemas.engines import FORMAT_ENGINE, SERVED_MODEL_NAME
    from workers.engines.ready import wait_ready
    from workers.runners.process import ServerProcess
    from workers.serving.builtin import LISTEN_LINE, server_argv

    cmd = server_argv(str(model), model_format="onnx", engine=FORMAT_ENGINE["onnx"], threads=threads,
                      instances=instances, extra=extra)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS=str(max(threads, 1)))

    with ServerProcess(cmd, env=env, listen_prefix=LISTEN_LINE, cpu_set=cpu_set) as server:
        server.wait_port(START_TIMEOUT_S)
        url = f"127.0.0.1:{server.port}"
        wait_ready(url, SERVED_MODEL_NAME, 30.0, alive=server.alive)
        yield url, server.pid

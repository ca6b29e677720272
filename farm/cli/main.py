"""``farm``: submit profiling requests, watch them, read results, run workers and servers."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from farm import export, lifecycle
from farm.cli import cluster, compare_cmd, op_profile_cmd, ops, report_cmd, request_options, views
from farm.cli.embedded import run_embedded
from farm.cli.errors import run_app, run_cli
from farm.cli.prepare import prepare_db
from farm.cli.request_options import build_request_dict, load_request_file
from farm.cli.views import console, err_console
from farm.db.models import utcnow
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.results import (
    find_request,
    merge_repeats,
    recent_requests,
    result_rows,
    status_counts,
    waiting_queues,
    workers_table,
)
from farm.settings import get_settings, mask_url
from scheduler.enqueue import enqueue_jobs
from scheduler.enqueue import submit as do_submit
from scheduler.reconcile import ReconcileReport, requeue_orphans
from scheduler.search import search_report, searches_done
from schemas import ProfileRequest
from schemas.job import FINAL, JobStatus
from schemas.request import LOAD_CLIENTS, MAX_REPEATS
from workers.spool import retry_db

app = typer.Typer(name="farm", help="A distributed profiling farm for ML model serving.",
                  no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@app.command()
def submit(
    model: str | None = typer.Argument(None, help="Model file (ONNX or TorchScript)."),
    engine: list[str] | None = typer.Option(None, "--engine", "-e", help=request_options.ENGINE_HELP),
    device: list[str] | None = typer.Option(None, "--device", "-d", help="cpu | gpu | gpu:<product>; repeat."),
    batch_sizes: str | None = typer.Option(None, "--batch-sizes", "-b", help="e.g. 1,4,16"),
    concurrency: str | None = typer.Option(None, "--concurrency", "-c", help="e.g. 1,4"),
    edge: list[str] | None = typer.Option(None, "--edge", help="cpus=1,memory=512m[,name=N][,cpuset=0-1]; repeat."),
    input_spec: list[str] | None = typer.Option(None, "--input", "-i", help="name:dtype:shape, e.g. x:FP32:3x224x224"),
    model_format: str | None = typer.Option(None, "--format", help=request_options.FORMAT_HELP),
    request_file: Path | None = typer.Option(None, "-f", "--file", help="Request file (YAML or JSON)."),
    name: str | None = typer.Option(None, "--name", help="A name for the request."),
    duration: float | None = typer.Option(None, "--duration", help="Fixed measurement time per job, s."),
    windows: int | None = typer.Option(None, "--windows", help="Maximum measurement windows per job."),
    window: float | None = typer.Option(None, "--window", help="Measurement window length, s."),
    warmup: float | None = typer.Option(None, "--warmup", help=request_options.WARMUP_HELP),
    stability: float | None = typer.Option(None, "--stability", help=request_options.STABILITY_HELP),
    stability_latency: str | None = typer.Option(None, "--stability-latency", help="mean (default, "
                                                 "perf_analyzer's rule) | p50 | p99: the latency that must "
                                                 "agree across windows, with throughput."),
    rate: str | None = typer.Option(None, "--rate", help="Open-loop request rates, req/s: 100, a list 50,100,200 "
                                    "or a range START:END:STEP (50:400:50); one job per rate, or the levels "
                                    "of --search quick."),
    mode: str | None = typer.Option(None, "--mode", help="closed | constant | poisson"),
    rpc: str | None = typer.Option(None, "--rpc", help="unary (default) | stream: ModelInfer calls or "
                                      "ModelStreamInfer streams."),
    threads: str | None = typer.Option(None, "--threads", help="Server intra-op threads (0 = default), e.g. 1,2."),
    instances: str | None = typer.Option(None, "--instances", help="Server model instances, e.g. 1,2."),
    queue_delay: str | None = typer.Option(None, "--max-queue-delay-us", help="Dynamic batching delays, µs, "
                                           "e.g. 0,500,2000 (default: no dynamic batching)."),
    preferred_batch: int | None = typer.Option(None, "--preferred-batch-size", help="Dynamic batching: run a "
                                               "batch as soon as it has this many rows."),
    search: str | None = typer.Option(None, "--search", help="brute (every concurrency and rate) | quick (the "
                                      "scheduler walks or bisects concurrency, or in open loop the --rate "
                                      "list, per serving configuration)."),
    p99: float | None = typer.Option(None, "--p99", help="Quick search latency budget, ms: the highest "
                                     "throughput with p99 within it (the highest concurrency or rate)."),
    client: str | None = typer.Option(None, "--client", help=f"{' | '.join(LOAD_CLIENTS)} (default auto): the "
                                      "load generator. auto: perf_analyzer where installed and able (unary calls, a "
                                      "server answering ModelConfig), else farm's own."),
    timeout: float | None = typer.Option(None, "--timeout", help="Per-job time limit, s."),
    op_profile: bool = typer.Option(False, "--op-profile", help="After each job's load measurement, a short "
                                    "pass with the engine's op profiler: time per node (`farm ops JOB_ID`)."),
    repeats: int | None = typer.Option(None, "--repeats", help=f"Runs of each cell (1 to {MAX_REPEATS}, default 1), "
                                       "interleaved round by round; `farm results` shows their median and range, "
                                       "`farm compare` needs several to judge."),
    input_data: str | None = typer.Option(None, "--input-data", help="random (default) | zeros | FILE (.npz or "
                                          ".json, one array per input, rows cycled)."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="HOST:PORT of a running KServe v2 gRPC server "
                                        "to profile instead of a model file (with --model-name)."),
    served_name: str | None = typer.Option(None, "--model-name", help="The model to profile on --endpoint."),
    wait: bool = typer.Option(False, "--wait", help="Cluster mode: wait for all jobs and print results."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"request_id\": ...} (and results with --wait)."),
) -> None:
    """Profile MODEL over devices x engines x batch sizes x concurrency or open-loop rates (+ edge runs)."""
    from workers.engines.triton import attach  # noqa: PLC0415 - grpc, tritonclient: +0.12 s on every CLI start, measured; submit only

    base = load_request_file(request_file) if request_file else {}
    data = build_request_dict(base, model, engine, device, batch_sizes, concurrency, edge, input_spec,
                              model_format, name,
                              dict(duration_s=duration, max_windows=windows, window_s=window, warmup_s=warmup,
                                   stability_pct=stability, stability_latency=stability_latency, rate=rate, mode=mode,
                                   threads=threads, instances=instances, timeout_s=timeout, rpc=rpc,
                                   max_queue_delay_us=queue_delay,
                                   preferred_batch_size=preferred_batch, search=search, p99_ms=p99,
                                   client=client, op_profile=op_profile or None),
                              extra=dict(input_data=input_data, endpoint=endpoint, model_name=served_name,
                                         repeats=repeats))
    request = ProfileRequest.model_validate(data)
    prepare_db()
    settings = get_settings()
    sub = do_submit(request, attach=attach)
    rid = sub.request_id
    if not as_json:
        left_out = len(sub.expansion.excluded)
        err_console.print(f"request [bold]{rid}[/]: {len(sub.expansion.jobs)} jobs"
                          + (f", {left_out} combinations left out" if left_out else ""))
        for ex in sub.expansion.excluded:
            coords = ", ".join(f"{k}={v}" for k, v in ex.items() if k != "reason")
            views.say(f"  left out {coords}: {ex['reason']}", to=err_console)
    if settings.embedded:
        run_embedded(rid, [j.job_id for j in sub.expansion.jobs], quiet=as_json)
        _show_results(rid, "json" if as_json else "table", with_id=as_json)
    elif wait:
        _wait(rid, quiet=as_json)
        _show_results(rid, "json" if as_json else "table", with_id=as_json)
    elif as_json:
        print(json.dumps({"request_id": rid}))
    else:
        console.print(f"queued on {mask_url(settings.broker_url)}; `farm status {rid}` to follow, "
                      f"`farm results {rid}` when done")


@app.command()
def resume(request_id: str = typer.Argument(..., help="Request id (or a unique prefix)."),
           wait: bool = typer.Option(False, "--wait", help="Cluster mode: wait for all jobs and print results."),
           as_json: bool = typer.Option(False, "--json", help="Print the results (or the re-sent count) as JSON."),
           ) -> None:
    """Finish a request: run its jobs not run yet and those cancelled by an interrupt (embedded), or re-send
    them to the workers (cluster). Jobs cancelled with `farm cancel` stay cancelled."""
    prepare_db()
    settings = get_settings()
    rid = find_request(request_id).id
    if settings.embedded:  # a `farm submit` killed outright (SIGKILL) left its job active: `farm scheduler`'s rule
        requeue_orphans(settings, utcnow(), ReconcileReport())
    with session_scope() as s:
        reopened = lifecycle.resume(s, rid)
        jobs = lifecycle.resumable(s, rid)
    if not as_json:
        err_console.print(f"request [bold]{rid}[/]: {len(jobs)} job(s) to run"
                          + (f", {len(reopened)} of them interrupted before" if reopened else ""))
    if settings.embedded and jobs:
        run_embedded(rid, [j for j, _ in jobs], quiet=as_json, command="farm resume")
    elif jobs:
        enqueue_jobs(jobs, request_id=rid)
    if settings.embedded or wait:
        if not settings.embedded:
            _wait(rid, quiet=as_json)
        _show_results(rid, "json" if as_json else "table", with_id=as_json)
    elif as_json:
        print(json.dumps({"request_id": rid, "resent": len(jobs)}))
    else:
        console.print(f"re-sent {len(jobs)} job(s) to {mask_url(settings.broker_url)}; `farm status {rid}` to follow")


def _poll(request_id: str) -> tuple[dict[str, int], bool]:
    """The request's job counts by status, and whether it is finished (every job final and every quick search
    done: a quick search adds steps as results land). A database blip (Postgres restarting) is retried with
    backoff for FARM_DB_RETRY_S, as workers do, before it fails the command."""
    def read() -> tuple[dict[str, int], bool]:
        counts = status_counts(request_id)
        done = sum(counts.get(s, 0) for s in FINAL) >= sum(counts.values())
        return counts, done and searches_done(request_id)

    return retry_db(read, get_settings().db_retry_s, what=f"status read of request {request_id}")


def _wait(request_id: str, quiet: bool, poll_s: float = 1.0) -> None:
    counts, finished = _poll(request_id)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, disable=quiet) as progress:
        task = progress.add_task("waiting for workers", total=sum(counts.values()))
        while True:
            progress.update(task, completed=sum(counts.get(s, 0) for s in FINAL), total=sum(counts.values()),
                            description=" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
            if finished:
                return
            time.sleep(poll_s)
            counts, finished = _poll(request_id)


def _show_results(request_id: str, fmt: str, with_id: bool = False, merge_with: list[str] | None = None) -> None:
    """Print the request's results; with ``merge_with`` (other request ids, maybe none), the repeats of
    each job config across all of them merged into one row (``farm.results.merge_repeats``)."""
    rows = result_rows(request_id)
    if merge_with is not None:
        rows = merge_repeats(rows + [r for rid in merge_with for r in result_rows(rid)])
    elif fmt == "table" and any(r["repeat"] for r in rows):  # the request's --repeats: median and range per cell
        rows = merge_repeats(rows, center="median")
    if fmt == "json":
        if with_id:
            print(json.dumps({"request_id": find_request(request_id).id, "results": json.loads(views.to_json(rows))},
                             indent=2))
        else:
            print(views.to_json(rows))
    elif fmt == "csv":
        sys.stdout.write(views.to_csv(rows))
    else:
        console.print(views.results_table(rows, title=_results_title(request_id, rows, merge_with)))
        for line in views.measured_lines(rows) + views.repeat_lines(rows):
            views.say(line)
        for line in views.error_lines(rows):
            views.say(line, style="red")
        for line in (views.steal_lines(rows) + views.host_lines(rows) + views.shared_lines(rows)
                     + views.client_limited_lines(rows)):
            views.say(line, style="yellow")


def _results_title(request_id: str, rows: list[dict[str, Any]], merge_with: list[str] | None) -> str:
    """The results table's title: the request, what it was merged with, and what all its rows share."""
    title = f"request {find_request(request_id).id}"
    if merge_with:
        title += f" merged with {', '.join(find_request(rid).id for rid in merge_with)}"
    if rows and rows[0]["rpc"] == "stream":
        title += " (load over ModelStreamInfer streams)"
    clients = sorted({r.get("client") or "farm" for r in rows} - {"auto"})  # auto: not measured yet
    if clients and clients != ["farm"]:
        title += f" (load sent by {' and '.join(clients)})"
    if rows and rows[0].get("server"):
        title += f"; server {rows[0]['server']}"
    if rows and rows[0].get("input_data", "random") != "random":
        title += f"; input data {rows[0]['input_data']}"
    return title


@app.command()
def results(request_ids: list[str] = typer.Argument(..., help="Request id (or a unique prefix); several "
                                                   "with --merge-repeats."),
            fmt: str = typer.Option("table", "--format", help="table | csv | json | parquet (parquet needs -o)"),
            merge: bool = typer.Option(False, "--merge-repeats",
                                       help="One row per job config over all the requests given: each metric "
                                            "combined by its declared aggregation (mean, max, sum, ...)."),
            output: Path | None = typer.Option(None, "--output", "-o", help="Export to this file: every "
                                               "coordinate, how it was measured, placement and metric column.")
            ) -> None:
    """Results of one request: one row per job, every metric."""
    if fmt not in ("table", "csv", "json", "parquet"):
        raise RequestError(f"--format {fmt!r} is unknown; use table, csv, json or parquet")
    if len(request_ids) > 1 and not merge:
        raise RequestError("several request ids are only read together with --merge-repeats; pass it or one id")
    prepare_db()
    if output is not None or fmt == "parquet":
        if merge or fmt == "table":
            raise RequestError("-o exports one request: give --format csv, json or parquet and no --merge-repeats")
        export.write(export.export_rows(request_ids[0]), fmt, output)
        views.say(f"wrote {output}")
        return
    _show_results(request_ids[0], fmt, merge_with=request_ids[1:] if merge else None)


@app.command()
def status(request_id: str | None = typer.Argument(None, help="Request id; omit for recent requests."),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Job counts by status (one request, or the recent ones) and jobs no live worker can serve."""
    prepare_db()
    if request_id is None:
        reqs = recent_requests()
        if as_json:
            print(views.to_json([{**r, "counts": r["counts"]} for r in reqs]))
            return
        table = Table(title="recent requests")
        for col in ("request", "name", "model", "created", "jobs"):
            table.add_column(col)
        for r in reqs:
            views.safe_row(table, r["request_id"], r["name"] or "-", str(r["model"]), views.age(r["created_at"]),
                          " ".join(f"{k}={v}" for k, v in sorted(r["counts"].items())))
        console.print(table)
        return
    counts = status_counts(request_id)
    waiting = waiting_queues(request_id)
    searches = search_report(request_id)
    if as_json:
        print(json.dumps({"counts": counts, "waiting": waiting, "searches": searches}))
        return
    console.print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    for sr in searches:  # quick search: where each serving configuration's search stands
        views.say(f"  search {views.config_label(sr['config'])}: {sr['state']}")
    for queue, n in waiting.items():
        views.say(f"{n} job(s) wait in queue {queue}: no live worker consumes it", style="yellow")
    for r in result_rows(request_id):
        if r["status"] != JobStatus.succeeded:
            views.say(f"  {r['job_id'][:8]} {r['device']} {r['engine']} b={r['batch_size']} "
                          f"c={r['concurrency']}{views.rate_text(r)} edge={r['edge_profile'] or '-'}: {r['status']}"
                          + (f" ({' '.join(str(r['error']).split())})" if r["error"] else ""))


@app.command()
def workers(as_json: bool = typer.Option(False, "--json")) -> None:
    """Registered workers, one line per slot: hardware, GPU, queues, runner, heartbeat and the job in hand."""
    prepare_db()
    rows = workers_table()
    if as_json:
        print(views.to_json(rows))
        return
    console.print(views.workers_table(rows))


# after the commands above, so `farm --help` lists them first
ops.register(app, db_app)  # worker, serve, db, example-model, analyze
report_cmd.register(app)
compare_cmd.register(app)
cluster.register(app)  # scheduler, cancel
op_profile_cmd.register(app)  # ops (op profiles; not ops.py's operator commands)


def main(args: list[str] | None = None) -> None:
    """Console-script entry point; ``args`` defaults to ``sys.argv[1:]`` (tests pass their own)."""
    run_cli(lambda: run_app(app, args))

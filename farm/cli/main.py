"""``farm``: submit profiling requests, watch them, read results, run workers and servers."""
from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from farm import lifecycle
from farm.cli import (
    cluster,
    compare_cmd,
    followups,
    llm_options,
    op_profile_cmd,
    ops,
    output,
    report_cmd,
    request_options,
    views,
)
from farm.cli.embedded import refuse_commands, run_embedded
from farm.cli.errors import run_app, run_cli
from farm.cli.live import LiveRun
from farm.cli.prepare import prepare_db
from farm.cli.request_options import ID_ARGS, build_request_dict, load_request_file, parse_knobs
from farm.cli.views import console, err_console
from farm.db.models import utcnow
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.knee import knees
from farm.results import (
    find_request,
    job_times,
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
from schemas.llm_engines import knob_help
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
    device: list[str] | None = typer.Option(None, "--device", "-d", help="cpu | gpu | gpu:<product>; repeat "
                                            f"(default {request_options.request_default('devices')})."),
    batch_sizes: str | None = typer.Option(None, "--batch-sizes", "-b", help="Batch sizes, a list: 1,4,16 "
                                     f"(default {request_options.request_default('batch_sizes')})."),
    concurrency: str | None = typer.Option(None, "--concurrency", "-c", help="Requests in flight, a list: 1,4 "
                                     f"(default {request_options.request_default('concurrency')})."),
    edge: list[str] | None = typer.Option(None, "--edge", help="cpus=1,memory=512m[,name=N][,cpuset=0-1]; repeat."),
    input_spec: list[str] | None = typer.Option(None, "--input", "-i", help="name:dtype:shape, e.g. x:FP32:3x224x224"),
    model_format: str | None = typer.Option(None, "--format", help=request_options.SUBMIT_FORMAT_HELP),
    request_file: Path | None = typer.Option(None, "-f", "--file", help="Request file (YAML or JSON)."),
    name: str | None = typer.Option(None, "--name", help="A name for the request."),
    duration: float | None = typer.Option(None, "--duration", help="Fixed measurement time per job, s (default: "
                                     "windows until stable)."),
    windows: int | None = typer.Option(None, "--windows", help="Maximum measurement windows per job "
                                  f"{request_options.measurement_default('max_windows')}."),
    window: float | None = typer.Option(None, "--window", help="Measurement window length, s "
                                  f"{request_options.measurement_default('window_s', 's')}."),
    warmup: float | None = typer.Option(None, "--warmup", help=request_options.WARMUP_HELP),
    stability: float | None = typer.Option(None, "--stability", help=request_options.STABILITY_HELP),
    stability_latency: str | None = typer.Option(None, "--stability-latency", help="mean (default, "
                                                 "perf_analyzer's rule) | p50 | p99: the latency that must "
                                                 "agree across windows, with throughput."),
    rate: str | None = typer.Option(None, "--rate", help=request_options.RATE_HELP),
    mode: str | None = typer.Option(None, "--mode", help="closed | constant | poisson "
                                 f"{request_options.measurement_default('mode')}."),
    rpc: str | None = typer.Option(None, "--rpc", help="unary (default) | stream: ModelInfer calls or "
                                      "ModelStreamInfer streams."),
    threads: str | None = typer.Option(None, "--threads", help="Server intra-op threads, a list: 1,2 (0: engine "
                                    f"default) {request_options.measurement_default('threads')}."),
    instances: str | None = typer.Option(None, "--instances", help="Server model instances, a list: 1,2 "
                                      f"{request_options.measurement_default('instances')}."),
    queue_delay: str | None = typer.Option(None, "--max-queue-delay-us", help="Dynamic batching delays, µs, "
                                           "e.g. 0,500,2000 (default: no dynamic batching)."),
    preferred_batch: int | None = typer.Option(None, "--preferred-batch-size", help="Dynamic batching: run a "
                                               "batch as soon as it has this many rows."),
    search: str | None = typer.Option(None, "--search", help="brute (default: every concurrency and rate) | quick (the "
                                      "scheduler walks or bisects concurrency, or in open loop the --rate "
                                      "list, per serving configuration) | max-goodput (LLM, with --slo: the "
                                      "highest Poisson rate keeping 95 % of requests within the SLO, doubling "
                                      "then bisecting from --rate, default 1 req/s)."),
    p99: float | None = typer.Option(None, "--p99", help="Quick search latency budget, ms: the highest "
                                     "throughput with p99 within it (the highest concurrency or rate)."),
    client: str | None = typer.Option(None, "--client", help=f"{' | '.join(LOAD_CLIENTS)} (default auto): the "
                                      "load generator. auto: perf_analyzer where installed and able (unary calls, a "
                                      "server answering ModelConfig), else farm's own; with --api: openai, "
                                      "farm's OpenAI streaming client."),
    timeout: float | None = typer.Option(None, "--timeout", help="Per-job time limit, s "
                                       f"{request_options.measurement_default('timeout_s', 's')}."),
    op_profile: bool = typer.Option(False, "--op-profile", help="After each job's load measurement, a short "
                                    "pass with the engine's op profiler: time per node (`farm ops JOB_ID`)."),
    repeats: int | None = typer.Option(None, "--repeats", help=f"Runs of each cell (1 to {MAX_REPEATS}, default 1), "
                                       "interleaved round by round; `farm results` shows their median and range, "
                                       "`farm compare` needs several to judge."),
    input_data: str | None = typer.Option(None, "--input-data", help="random (default) | zeros | FILE (.npz or "
                                          ".json, one array per input, rows cycled)."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="HOST:PORT of a running KServe v2 gRPC server "
                                        "to profile instead of a model file (with --model-name); with --api: "
                                        "http://HOST:PORT\\[/v1] of an OpenAI-compatible LLM server."),
    served_name: str | None = typer.Option(None, "--model-name", help="The model to profile on --endpoint."),
    knob: list[str] | None = typer.Option(None, "--knob", help=f"NAME=V1[,V2...] (repeatable): an LLM engine's "
                                          f"setting as a matrix dimension. {knob_help()}."),
    api: str | None = llm_options.API,
    api_key_env: str | None = llm_options.API_KEY_ENV,
    input_tokens: str | None = llm_options.INPUT_TOKENS,
    output_tokens: str | None = llm_options.OUTPUT_TOKENS,
    prefix_tokens: int | None = llm_options.PREFIX_TOKENS,
    seed: int | None = llm_options.SEED,
    prompts: str | None = llm_options.PROMPTS,
    tokenizer: str | None = llm_options.TOKENIZER,
    slo: str | None = llm_options.SLO,
    requests: int | None = llm_options.REQUESTS,
    warmup_requests: int | None = llm_options.WARMUP_REQUESTS,
    wait: bool = typer.Option(False, "--wait", help="Cluster mode: wait for all jobs and print results."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"request_id\": ...} (and results with --wait)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the matrix (jobs, left-out combinations, "
                                 "searches, estimated time) and exit; nothing is stored or run."),
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
                                         repeats=repeats, knobs=parse_knobs(knob)))
    data = llm_options.apply(data, api=api, api_key_env=api_key_env, input_tokens=input_tokens,
                             output_tokens=output_tokens, prefix_tokens=prefix_tokens, seed=seed, prompts=prompts,
                             tokenizer=tokenizer, slo=slo, requests=requests, warmup_requests=warmup_requests)
    request = ProfileRequest.model_validate(data)
    refuse_commands(request)
    if dry_run:
        followups.dry_run(request, attach, as_json)
        return
    prepare_db()
    settings = get_settings()
    sub = do_submit(request, attach=llm_options.attach_for(request, attach))
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
    elif wait:
        _wait(rid, quiet=as_json)
    elif as_json:
        print(json.dumps({"request_id": rid}))
        return
    else:
        console.print(f"queued on {mask_url(settings.broker_url)}")
        followups.next_hint(f"farm status {rid[:8]} to follow", f"farm results {rid[:8]} when done")
        return
    output.show(rid, "json" if as_json else "table", with_id=as_json)
    if not as_json:
        followups.show_searches(rid)
        followups.next_hint(*followups.results_hints(rid))


@app.command(context_settings=ID_ARGS)
def resume(request_id: str = typer.Argument(..., callback=request_options.request_ids,
                                           help=request_options.ID_HELP),
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
        output.show(rid, "json" if as_json else "table", with_id=as_json)
        if not as_json:
            followups.show_searches(rid)
            followups.next_hint(*followups.results_hints(rid))
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
    """Wait for the request's jobs on the cluster: each job's headline as it lands, above a bar whose ETA uses the
    measured times of the jobs finished so far and the number running at once (``farm.cli.live``)."""
    counts, finished = _poll(request_id)
    seen: set[str] = set()
    with LiveRun(sum(counts.values()), quiet) as live:
        while True:
            live.set_total(sum(counts.values()), parallel=counts.get(JobStatus.running, 0))
            live.step("waiting for workers: " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
            rows, times = retry_db(lambda: (result_rows(request_id), job_times(request_id)),
                                   get_settings().db_retry_s, what=f"results read of request {request_id}")
            for row in rows:
                if row["status"] in FINAL and row["job_id"] not in seen:
                    seen.add(row["job_id"])
                    started, ended = times.get(row["job_id"], (None, None))
                    live.finished(row, (ended - started).total_seconds() if started and ended else None)
            if finished:
                return
            time.sleep(poll_s)
            counts, finished = _poll(request_id)


@app.command(context_settings=ID_ARGS)
def results(request_ids: list[str] = typer.Argument(..., callback=request_options.request_ids,
                                                   help=request_options.ID_HELP + " Several with --merge-repeats."),
            fmt: str = typer.Option("table", "--format", help="table | wide | csv | json | parquet (parquet "
                                    "needs -o)."),
            merge: bool = typer.Option(False, "--merge-repeats",
                                       help="One row per job config over all the requests given: each metric "
                                            "combined by its declared aggregation (mean, max, sum, ...)."),
            out: Path | None = typer.Option(None, "--output", "-o", help="Write to this file instead (any format; "
                                            "the same columns as on stdout). -o wide: the wide table."),
            wide: bool = typer.Option(False, "--wide", help="The table with every column and more metrics."),
            columns: str | None = typer.Option(None, "--columns", help="The table's metric columns: names or "
                                               "labels, e.g. infer/s,p99 ms,CPU % or latency_p90_ms."),
            ) -> None:
    """Results of one request: one row per job; the table fits 80 columns (--wide, --columns for more), the
    exports hold every column."""
    fmt, path, wide = output.parse_output(fmt, out, wide)
    metrics = views.parse_columns(columns) if columns is not None else None
    if len(request_ids) > 1 and not merge:
        raise RequestError("several request ids are only read together with --merge-repeats; pass it or one id")
    prepare_db()
    rid, *others = [find_request(r).id for r in request_ids]
    output.show(rid, fmt, path, wide=wide, metrics=metrics, merge_with=others if merge else None)
    if path is not None:
        views.say(f"wrote {path}", to=err_console)
    elif fmt == "table":
        followups.next_hint(*followups.results_hints(rid))


@app.command(context_settings=ID_ARGS)
def status(request_id: str | None = typer.Argument(None, callback=request_options.request_ids,
                                                   help=request_options.ID_HELP + " Omit it for the recent requests."),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """One request: each job's state, coordinates and time, its quick searches' answers and jobs no live
    worker can serve; without an id, the recent requests."""
    prepare_db()
    if request_id is None:
        reqs = recent_requests()
        if as_json:
            print(views.to_json([{**r, "counts": r["counts"]} for r in reqs]))
            return
        console.print(views.requests_table(reqs))
        if reqs:
            followups.next_hint("farm status latest", "farm results latest")
        return
    rid = find_request(request_id).id
    counts, waiting, searches = status_counts(rid), waiting_queues(rid), search_report(rid)
    rows, times = result_rows(rid), job_times(rid)
    if as_json:
        jobs = [{"job_id": r["job_id"], "status": r["status"], "device": r["device"], "engine": r["engine"],
                 "batch_size": r["batch_size"], "concurrency": r["concurrency"], "rate": r["rate"],
                 "started_at": times[r["job_id"]][0], "finished_at": times[r["job_id"]][1]} for r in rows]
        print(json.dumps({"request_id": rid, "counts": counts, "waiting": waiting, "searches": searches,
                          "knees": [k.as_json(label) for label, k in knees(rows)],
                          "jobs": followups.job_payload(jobs)}))
        return
    console.print(views.status_table(rows, times, title=f"request {rid}: "
                                     + " ".join(f"{k}={v}" for k, v in sorted(counts.items()))))
    for label, knee in knees(rows):  # an LLM concurrency sweep: where more concurrency stops buying tokens/s
        views.say(f"{label}: {knee.text()}")
    for sr in searches:  # quick search: where each serving configuration's search stands, or its answer
        views.say(f"search {views.config_label(sr['config'])}: {sr['state']}", style="bold" if sr["done"] else None)
    for queue, n in waiting.items():
        views.say(f"{n} job(s) wait in queue {queue}: no live worker consumes it", style="yellow")
    for line in views.error_lines(rows):
        views.say(line, style="red")
    done = sum(counts.get(s, 0) for s in FINAL) >= sum(counts.values())
    followups.next_hint(*(followups.results_hints(rid) if done else [f"farm results {rid[:8]}",
                                                                     f"farm cancel {rid[:8]}"]))


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

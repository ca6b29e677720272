"""``farm``: submit profiling requests, watch them, read results, run workers and servers."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from farm import lifecycle
from farm.cli import (
    cluster,
    compare_cmd,
    events_cmd,
    followups,
    llm_options,
    op_profile_cmd,
    ops,
    output,
    remote,
    report_cmd,
    request_options,
    server_cmd,
    submit_options,
    views,
)
from farm.cli.embedded import local_gpu_products, refuse_commands, run_embedded
from farm.cli.errors import run_app, run_cli
from farm.cli.live import LiveRun
from farm.cli.prepare import prepare_db
from farm.cli.request_options import ID_ARGS
from farm.cli.views import console, err_console
from farm.db.models import utcnow
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.readers.knee import knees
from farm.readers.results import (
    find_request,
    job_times,
    recent_requests,
    result_rows,
    status_counts,
    waiting_queues,
    workers_table,
)
from farm.settings import get_settings, mask_url
from scheduler.enqueue import Submission, enqueue_jobs
from scheduler.enqueue import submit as do_submit
from scheduler.reconcile import ReconcileReport, requeue_orphans
from scheduler.search import search_report, searches_done
from schemas import ProfileRequest
from schemas.job import FINAL, JobStatus
from workers.spool import retry_db

app = typer.Typer(name="farm", help="A distributed profiling farm for ML model serving.",
                  no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@app.command()
@submit_options.command  # its options: farm.cli.submit_options, declared against the request model
def submit(**opts: Any) -> None:
    """Profile MODEL over devices x engines x batch sizes x concurrency or open-loop rates (+ edge runs)."""
    from workers.engines.triton import attach  # noqa: PLC0415 - grpc, tritonclient: +0.12 s on every CLI start, measured; submit only

    wait, as_json = opts["wait"], opts["as_json"]
    request = ProfileRequest.model_validate(submit_options.request_data(opts))
    refuse_commands(request)
    if opts["dry_run"]:  # the reader the submission uses: an LLM endpoint's is the OpenAI API's
        followups.dry_run(request, llm_options.attach_for(request, attach), as_json)
        return
    if get_settings().remote:  # a shared farm: through `farm server` (FARM_API_URL, FARM_TOKEN)
        remote.submit(request, wait, as_json)
        return
    prepare_db()
    _submitted(do_submit(request, attach=llm_options.attach_for(request, attach), gpu_products=local_gpu_products()),
               wait, as_json)


def _submitted(sub: Submission, wait: bool, as_json: bool) -> None:
    """After ``farm submit`` stored a request: say what it expanded to, then run it here (embedded), wait for
    it (``--wait``) or say where it was queued."""
    settings = get_settings()
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
    if get_settings().remote:
        raise RequestError("farm resume runs on the farm's own hosts; through the API, submit the request again")
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
                if row.status in FINAL and row.job_id not in seen:
                    seen.add(row.job_id)
                    started, ended = times.get(row.job_id, (None, None))
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
    if get_settings().remote:
        remote.results(request_ids, fmt, path, wide, metrics, merge)
        return
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
    if get_settings().remote:
        remote.status(request_id, as_json)
        return
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
    if get_settings().remote:
        rows = remote.worker_rows()
    else:
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
server_cmd.register(app)  # server (the API and web view), token
events_cmd.register(app)  # events (an LLM job's event log)


def main(args: list[str] | None = None) -> None:
    """Console-script entry point; ``args`` defaults to ``sys.argv[1:]`` (tests pass their own)."""
    run_cli(lambda: run_app(app, args))

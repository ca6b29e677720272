"""What a user does next: ``farm submit --dry-run`` (the matrix, its searches and an estimated time, nothing
written), the quick searches' answers, and the ``next:`` hint printed after a command."""
from __future__ import annotations

import json
import math
from typing import Any

from farm.cli.embedded import local_gpu_products
from farm.cli.views import config_label, err_console, jobs_table, say
from farm.endpoint import Attach
from farm.settings import get_settings
from scheduler.enqueue import plan
from scheduler.goodput_rules import MAX_STEPS
from scheduler.search import search_report
from schemas import JobSpec, ProfileRequest

#: a job's time outside its measured windows: server start and model load, the host yardstick before and after,
#: result write (1-2 s per job with the process runner on this project's 2-core host; more in a container)
JOB_OVERHEAD_S = 2.0


def job_seconds(spec: JobSpec) -> tuple[float, float]:
    """The shortest and longest time one job should take, s: warm-up plus its fixed duration, or plus its
    windows from ``min_windows`` (stable at once) to ``max_windows``, plus ``JOB_OVERHEAD_S``."""
    m = spec.measurement
    if m.duration_s is not None:
        low = high = m.warmup_s + m.duration_s
    else:
        low, high = m.warmup_s + m.min_windows * m.window_s, m.warmup_s + m.max_windows * m.window_s
    return low + JOB_OVERHEAD_S, high + JOB_OVERHEAD_S


def search_steps(request: ProfileRequest) -> int:
    """The most steps one search takes (quick: a bisection of its levels, then the walk to the top; max-goodput:
    its step cap); 1 for brute."""
    if request.measurement.search == "max-goodput":
        return MAX_STEPS
    if request.measurement.search != "quick":
        return 1
    return min(len(request.search_levels()), 1 + math.ceil(math.log2(max(1, len(request.search_levels())))))


def dry_run(request: ProfileRequest, attach: Attach | None, as_json: bool) -> None:
    """Print the matrix the request expands to (jobs, left-out combinations, quick searches, estimated time)
    and write nothing: the model is inspected, not stored; no request or job row is written."""
    sub, _, _ = plan(request, attach=attach, gpu_products=local_gpu_products())
    jobs, excluded = sub.expansion.jobs, sub.expansion.excluded
    steps = search_steps(request)
    low = sum(job_seconds(j)[0] for j in jobs)
    high = sum(job_seconds(j)[1] for j in jobs) * steps
    searches = len(jobs) if request.measurement.search != "brute" else 0
    if as_json:
        print(json.dumps({"jobs": [j.model_dump(mode="json", include={"device", "engine", "batch_size",
                                                                       "concurrency", "edge_profile", "repeat"})
                                   | {"rate": j.rate} for j in jobs],
                          "excluded": excluded, "searches": searches, "max_steps_per_search": steps,
                          "estimated_s": [round(low), round(high)]}))
        return
    err_console.print(jobs_table(jobs, title=f"dry run: {len(jobs)} job(s)"))
    for ex in excluded:
        coords = ", ".join(f"{k}={v}" for k, v in ex.items() if k != "reason")
        say(f"left out {coords}: {ex['reason']}", to=err_console)
    if searches:
        say(f"{searches} {request.measurement.search} search(es): the first step of each is above; each takes up "
            f"to {steps} step(s)", to=err_console)
    where = "in this process" if get_settings().embedded else "on the cluster's workers, one job per slot at once"
    say(f"estimated time {_span(low, high)} {where} (windows from min to max, plus about {JOB_OVERHEAD_S:g} s "
        "per job to start its server and calibrate); nothing was written", to=err_console)
    next_hint("the same `farm submit` without --dry-run runs it")


def _span(low: float, high: float) -> str:
    """``40 s to 2 min``: a time range for humans."""
    def one(s: float) -> str:
        return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"
    return one(low) if one(low) == one(high) else f"{one(low)} to {one(high)}"


def search_lines(request_id: str) -> list[str]:
    """Each search of the request (quick or max-goodput): its serving configuration and its state or answer
    (empty for brute)."""
    return [f"search {config_label(sr['config'])}: {sr['state']}" for sr in search_report(request_id)]


def show_searches(request_id: str) -> None:
    """Print the searches' answers (``search_lines``), if the request has any."""
    for line in search_lines(request_id):
        say(line, style="bold")


def next_hint(*commands: str) -> None:
    """The ``next:`` line after a command: what to run now, on stderr (stdout stays the command's output)."""
    say("next: " + " · ".join(commands), style="dim", to=err_console)


def results_hints(request_id: str) -> list[str]:
    """The follow-ups of a finished request: its report as HTML, every column, a comparison."""
    rid = request_id[:8]
    return [f"farm report {rid} -o report.html", f"farm results {rid} --wide", f"farm compare {rid} <other id>"]


def job_payload(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Status rows as ``farm status ID --json`` prints them (timestamps as ISO text)."""
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows]

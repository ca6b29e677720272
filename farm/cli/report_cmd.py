"""``farm report``: the answer to "which configuration is best under my budget, and does the edge box fit"."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from farm.cli import remote
from farm.cli.followups import next_hint
from farm.cli.prepare import prepare_db
from farm.cli.request_options import ID_ARGS, ID_HELP, request_ids
from farm.cli.views import (
    config_label,
    console,
    fmt_value,
    job_label,
    load_label,
    measured_lines,
    rate_text,
    safe_row,
    say,
    serving_label,
    shared_lines,
    turn_lines,
)
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.formatting import safe_text
from farm.models.analysis import headline
from farm.op_profile import breakdown_line, by_op_type, request_profiles
from farm.readers.report import (
    LLM_EDGE_FIGURES,
    LLM_RANKED,
    Constraint,
    Report,
    build_report,
    llm_edge,
    llm_edge_figures,
    parse_constraint,
    within_slo_pct,
)
from farm.readers.results import find_request, llm_rows, model_static_metrics, request_goals, result_rows
from farm.readers.rows import ResultRow
from farm.settings import get_settings
from schemas import COORDINATE_KEYS
from schemas.metrics import BY_NAME
from schemas.result import shared_unisolated


def report(
    request_id: str = typer.Argument(..., callback=request_ids, help=ID_HELP),
    objective: str | None = typer.Option(None, "--objective", help="Metric to rank by (default: "
                                         "throughput_infer_per_s; output_tokens_per_s for LLM rows); its direction "
                                         "(higher/lower is better) comes from the metric registry."),
    constraint: list[str] | None = typer.Option(None, "--constraint", "-C",
                                                   help="metric=limit, e.g. latency_p99_ms=20; repeat."),
    p99: float | None = typer.Option(None, "--p99", help="Shorthand for --constraint latency_p99_ms=MS."),
    stable: bool = typer.Option(False, "--stable", help="Rank only measurements that stabilised."),
    top: int = typer.Option(10, "--top", min=1, help="How many ranked configurations to show."),
    as_json: bool = typer.Option(False, "--json"),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write a self-contained HTML report (plots, "
                                       "summary, every job) to this file; it opens offline."),
) -> None:
    """Rank the request's configurations under constraints; say which edge profiles fit."""
    constraints = _constraints(constraint or [], p99)
    if get_settings().remote:
        _remote(request_id, objective, constraints, stable, top, as_json, output)
        return
    prepare_db()
    if output is not None:
        from farm.readers.report_html import render  # noqa: PLC0415 - matplotlib: +1.2 s on every CLI start, measured

        output.write_text(render(request_id, objective, constraints, stable), encoding="utf-8")
        say(f"wrote {output}")
        next_hint(f"open {output} in a browser (it works offline)")
        return
    req = find_request(request_id)
    rep = build_report(result_rows(req.id), objective, constraints, stable, request_goals(req))
    static = model_static_metrics(req.model_sha256)
    with session_scope() as s:
        profiles = request_profiles(s, req.id)
    if as_json:
        print(json.dumps({**_as_json(req.id, rep, top, static), "op_profiles": [
            {"job_id": p.job_id, **p.job, "status": p.profile.status, "reason": p.profile.reason,
             "compute_ms": p.profile.compute_ms, "op_types": by_op_type(p.profile),
             "top_nodes": [n.model_dump() for n in p.profile.nodes[:top]]} for p in profiles]},
            indent=2, default=str))
        return
    _print_ranked(req.id, rep, top)
    _print_verdicts(rep)
    for p in profiles:  # --op-profile: where the time goes inside the model, per job
        say(f"ops {breakdown_line(p)}")
    for line in measured_lines(rep.ranked[:top] + rep.edge):
        say(line)
    shown = [k for k in ("params", "macs_per_sample", "flops_per_sample") if k in static]
    if shown:  # an LLM model's static metrics hold none of these
        console.print("model: " + ", ".join(f"{BY_NAME[k].title} {headline(static, k)}" for k in shown))
    next_hint(f"farm report {req.id[:8]} -o report.html (plots, every job)", f"farm compare {req.id[:8]} <other id>")


def _remote(request_id: str, objective: str | None, constraints: list[Constraint], stable: bool, top: int,
            as_json: bool, output: Path | None) -> None:
    """``farm report`` through farm's API: the HTML report rendered by the server, the ranking here."""
    if output is not None:
        if constraints:
            raise RequestError("over the API, -o report.html takes --objective and --stable; rank with --p99 and "
                               "--constraint in the terminal report")
        remote.report_html(request_id, output, objective, stable)
        return
    data = remote.rows_of(remote.Api(), request_id)
    rep = build_report(data.rows, objective, constraints, stable, data.slo)
    if as_json:
        print(json.dumps(_as_json(data.request_id, rep, top, data.static), indent=2, default=str))
        return
    _print_ranked(data.request_id, rep, top)
    _print_verdicts(rep)


def _constraints(texts: list[str], p99: float | None) -> list[Constraint]:
    """The ``--constraint`` options, then ``--p99`` as ``latency_p99_ms=MS``."""
    constraints = [parse_constraint(c) for c in texts]
    if p99 is not None:
        constraints.append(parse_constraint(f"latency_p99_ms={p99}"))
    return constraints


def _short(r: ResultRow, objective: str) -> dict[str, Any]:
    return {**{k: r.get(k) for k in ("job_id", *COORDINATE_KEYS[:-1], objective, "latency_p99_ms",
                                     "throughput_infer_per_s", "stable", "measured")},
            "shared_unisolated": shared_unisolated(r)}


def _as_json(request_id: str, rep: Report, top: int, static: dict[str, Any]) -> dict[str, Any]:
    """The report as ``--json`` prints it."""
    objective = rep.objective
    return {
        "request_id": request_id, "objective": objective, "constraints": [str(c) for c in rep.constraints],
        "ranked": [_short(r, objective) for r in rep.ranked[:top]],
        "best_per_device": {d: _short(r, objective) for d, r in rep.best_per_device.items()},
        "best_per_serving": [_short(r, objective) for r in rep.best_per_serving],
        "rejected": [{**_short(r, objective), "reason": why} for r, why in rep.rejected],
        "edge": [{"edge_profile": e["edge_profile"], "engine": e["engine"], "batch_size": e["batch_size"],
                  "fits": e["fits"], "oom": e["oom"], "measured": e.get("measured"),
                  **{k: e.get(k) for k in LLM_EDGE_FIGURES if e.get(k) is not None},
                  "within_slo_pct": within_slo_pct(e),
                  "reason": e["reason"], "throughput_infer_per_s": e.get("throughput_infer_per_s"),
                  "latency_p99_ms": e.get("latency_p99_ms"), "mem_peak_bytes": e.get("mem_peak_bytes"),
                  "mem_limit_bytes": e.get("mem_limit_bytes"), "limits_enforced": e.get("limits_enforced")}
                 for e in rep.edge],
        "knees": [k.as_json(label) for label, k in rep.knees],
        "model": static,
    }


def _print_ranked(request_id: str, rep: Report, top: int) -> None:
    """The table of the ``top`` ranked configurations (or a line saying none qualifies)."""
    objective, constraints = rep.objective, rep.constraints
    title = f"request {request_id}: best by {BY_NAME[objective].title}" + (
        f" with {', '.join(map(str, constraints))}" if constraints else "")
    table = Table(title=safe_text(title), box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    shown = LLM_RANKED if llm_rows(rep.ranked) else ("throughput_infer_per_s", "latency_p50_ms", "latency_p99_ms",
                                                     "stable")
    cols = [objective] + [m for m in shown if m != objective]
    serving = any(serving_label(r) != "-" for r in rep.ranked[:top])
    for c in ("#", "job", "device", "engine", *(("serving",) if serving else ()), "b x c"):
        table.add_column(c, justify="right" if c == "#" else "left", no_wrap=True, overflow="ellipsis")
    for c in cols:  # the registry's short labels with units (80 columns)
        table.add_column(BY_NAME[c].label, justify="right", no_wrap=True, min_width=len(BY_NAME[c].label))
    for i, r in enumerate(rep.ranked[:top], 1):
        safe_row(table, str(i), job_label(r), r["device"], r["engine"], *((serving_label(r),) if serving else ()),
                 load_label(r), *(fmt_value(c, r.get(c)) for c in cols))
    console.print(table)
    if not rep.ranked:
        console.print("[yellow]no configuration meets the constraints[/]")
    for line in shared_lines(rep.ranked[:top]):
        say(line, style="yellow")


def _print_verdicts(rep: Report) -> None:
    """The best configuration per device, the ones left out (first five) and each edge profile's verdict."""
    objective = rep.objective
    for device, r in rep.best_per_device.items():
        say(f"best on {device}: {r['engine']} batch {r['batch_size']} x concurrency {r['concurrency']}"
                      f"{rate_text(r)} ({serving_label(r)}) → {_figure(objective, r)}")
    if len(rep.best_per_serving) > 1:  # grouped by serving configuration (instances, threads, batching)
        for r in rep.best_per_serving:
            say(f"  best of {config_label(r)}: concurrency {r['concurrency']}{rate_text(r)} → {_figure(objective, r)}")
    if rep.rejected:
        say(f"{len(rep.rejected)} configuration(s) left out: "
            + "; ".join(f"{r['job_id'][:6]} {why}" for r, why in rep.rejected[:5])
            + (" ..." if len(rep.rejected) > 5 else ""))
    for label, knee in rep.knees:  # LLM concurrency sweeps: where more concurrency stops buying tokens/s
        say(f"{label}: {knee.text()}")
    for line in turn_lines(rep.ranked):  # sessions: TTFT and the prefix-cache share per turn
        say(line)
    for e in rep.edge:
        verdict = ("fits" if e["fits"] else e["reason"] if e["fits"] is None
                   else f"does not fit ({e['reason']})")
        if llm_edge(e):
            say(f"edge {e['edge_profile']} {e['engine']} (served over HTTP): {verdict}; {llm_edge_figures(e)}")
            continue
        say(f"edge {e['edge_profile']} at batch {e['batch_size']} (in-process): {verdict}; "
            f"{fmt_value('throughput_infer_per_s', e.get('throughput_infer_per_s'))} infer/s, "
            f"p99 {fmt_value('latency_p99_ms', e.get('latency_p99_ms'))} ms, memory peak "
            f"{fmt_value('mem_peak_bytes', e.get('mem_peak_bytes'))} of "
            f"{fmt_value('mem_limit_bytes', e.get('mem_limit_bytes'))} MiB")


def _figure(name: str, row: ResultRow) -> str:
    """A metric of a row for a sentence: ``762 infer/s``, ``4.1 ms p99 latency`` (the registry's unit and title)."""
    m = BY_NAME[name]
    unit = "MiB" if m.unit == "B" else m.unit
    return f"{fmt_value(name, row.get(name))} {unit}" + ("" if m.higher_is_better else f" {m.title}")


def register(app: typer.Typer) -> None:
    app.command(context_settings=ID_ARGS)(report)  # -1, -2: request ids

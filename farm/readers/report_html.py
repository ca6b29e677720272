"""``farm report REQUEST_ID -o report.html``: one self-contained HTML file (inline SVG plots, inline CSS, a
Content-Security-Policy that forbids every fetch) with the summary, the plots and every job.

The ranking is ``farm.readers.report.build_report``; rows, details and static metrics come from
``farm.readers.results``.
"""
from __future__ import annotations

import base64
import hashlib
import html
from datetime import UTC, datetime
from typing import Any

from farm.db.session import session_scope
from farm.formatting import fmt_value, knobs_text, rate_text
from farm.llm_events import TOOLS
from farm.op_profile import request_profiles
from farm.readers import report_llm_plots as llm_plots
from farm.readers import report_ops
from farm.readers import report_plots as plots
from farm.readers.events import side_by_side, stored_figures
from farm.readers.report import Constraint, Report, build_report, llm_edge, llm_edge_figures
from farm.readers.results import (
    MEASUREMENT_COLUMNS,
    METRIC_NAMES,
    find_request,
    llm_rows,
    load_details,
    model_static_metrics,
    request_goals,
    result_details,
    result_rows,
)
from farm.readers.rows import ResultRow
from farm.settings import get_settings
from farm.steal import steal_note
from schemas.llm import Slo
from schemas.measured import MEASURED_EDGE
from schemas.metrics import BY_NAME, MODEL_METRICS
from schemas.result import host_notes, shared_unisolated

#: after loading, each plot's figure gets its rendered size, mark count and smallest text as rendered (px: the
#: SVG's font size times its scale on the page), and the body the width of the "Every job" table against the
#: window's (a reader sees a blank or shrunken plot flagged; the browser test reads them back)
CHECK_JS = ("document.querySelectorAll('figure.plot').forEach(function(f){var s=f.querySelector('svg');"
            "var r=s?s.getBoundingClientRect():{width:0,height:0};"
            "f.setAttribute('data-rendered',Math.round(r.width)+'x'+Math.round(r.height));"
            "f.setAttribute('data-marks',s?s.querySelectorAll('path,use,rect,text').length:0);"
            "var k=s&&s.viewBox.baseVal&&s.viewBox.baseVal.width?r.width/s.viewBox.baseVal.width:1,m=1e9;"
            "if(s)s.querySelectorAll('text').forEach(function(t){"
            "m=Math.min(m,parseFloat(getComputedStyle(t).fontSize)*k);});"
            "f.setAttribute('data-min-font',m<1e9?m.toFixed(1):'');});"
            "var j=document.getElementById('jobs-summary');if(j)document.body.setAttribute('data-jobs-width',"
            "Math.ceil(j.getBoundingClientRect().right)+'/'+document.documentElement.clientWidth);"
            "document.body.setAttribute('data-checked','1');")
CSS = """body{font-family:sans-serif;margin:1.5em;color:#222;font-size:15px}
table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}td.l,th.l{text-align:left}
td.w{white-space:normal;max-width:16em}th{background:#eee;position:sticky;top:0}figure.plot{margin:1em 0}
figure.plot svg{max-width:100%;height:auto}abbr{text-decoration:underline dotted}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.4em .8em}.bad{color:#b00}.wide{overflow-x:auto}"""
#: the metrics of the "Every job" table (those some job measured), in this order; every metric is in "All metrics"
HEADLINE = ("throughput_infer_per_s", "latency_p50_ms", "latency_p99_ms", "server_compute_p50_ms", "stable",
            "error_count", "cpu_pct_avg", "mem_peak_bytes", "gpu_util_avg_pct", "gpu_mem_peak_bytes")
#: the same for LLM rows (the OpenAI client's)
LLM_HEADLINE = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "goodput_req_per_s",
                "requests_per_s", "error_count", "cpu_pct_avg", "mem_peak_bytes", "mem_limit_bytes")
#: a serving configuration's keys, compactly (``1 inst · 2 thr · delay 100 µs``)
SERVING_SHORT = {"instances": "{} inst", "threads": "{} thr", "max_queue_delay_us": "delay {} µs",
                 "preferred_batch_size": "pref. batch {}"}


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _num(name: str, v: Any) -> str:
    """A metric for a reader: the CLI's format (``farm.formatting.fmt_value``), integers with thousands
    separators (``12,683,845``), bytes in MiB to three significant digits."""
    if isinstance(v, int | float) and not isinstance(v, bool) and BY_NAME[name].unit == "B":
        mib = v / 2**20  # three significant digits below 1,000 MiB, so a small tensor is not "0.0"
        return f"{mib:,.0f}" if mib >= 1000 else f"{mib:.3g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return fmt_value(name, v)


def _head(name: str) -> str:
    """A column header: the registry's short label (with MiB for bytes), its title and unit as a tooltip."""
    m = BY_NAME[name]
    short = f"{m.label} MiB" if m.unit == "B" else m.label
    return f'<th title="{_e(m.title)} ({_e("MiB" if m.unit == "B" else m.unit)})">{_e(short)}</th>'


def _config(r: ResultRow) -> str:
    edge = f" edge {r['edge_profile']}" if r.get("edge_profile") else ""
    return f"{r['device']} {r['engine']} batch {r['batch_size']} × concurrency {r['concurrency']}{rate_text(r)}{edge}"


def render(request_id: str, objective: str | None = None, constraints: list[Constraint] | None = None,
           require_stable: bool = False) -> str:
    """The report of request ``request_id`` as one HTML document (no ``objective``: ``farm.readers.report``'s default
    for the rows)."""
    req = find_request(request_id)
    rows = result_rows(req.id)
    slo = request_goals(req)
    rep = build_report(rows, objective, constraints or [], require_stable, slo)
    figures = plot_figures(rows, rep, slo)
    title = f"farm report: {req.spec.get('model', req.id)}"
    body = [f"<h1>{_e(title)}</h1>",
            f"<p>request <code>{_e(req.id)}</code>{' (' + _e(req.name) + ')' if req.name else ''}, model sha256 "
            f"<code>{_e(req.model_sha256[:12])}</code>, {len(rows)} jobs; generated "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC</p>",
            _how_measured(rows), _summary(rep), "<h2>Plots</h2>",
            *(f'<figure class="plot" id="plot-{fid}">{svg}</figure>' for fid, svg in figures if svg),
            _tools(rows), _static(model_static_metrics(req.model_sha256)), _op_profiles(req.id), _jobs(rows)]
    return _page(title, "\n".join(body))


def plot_figures(rows: list[ResultRow], rep: Report, slo: Slo | None) -> list[tuple[str, str | None]]:
    """The report's plots of ``rows`` as (id, inline SVG or None where the rows give it nothing to show); the
    HTML report and ``farm server``'s request page show the same."""
    top = rep.ranked[:3]
    details = result_details([r["job_id"] for r in top])
    cdf = [(_config(r), load_details(details.get(r["job_id"], {})).latency_histogram) for r in top]
    return [
        ("throughput-p99", plots.throughput_vs_p99(rows)),
        ("batch", plots.by_batch(rows, ("throughput_infer_per_s", "latency_p99_ms"),
                                 "Throughput and p99 latency vs batch size")),
        ("e2e-compute", plots.e2e_vs_compute(rows)),
        ("resources", plots.by_batch(rows, ("cpu_pct_avg", "mem_peak_bytes", "gpu_mem_peak_bytes", "gpu_util_avg_pct",
                                            "gpu_power_avg_w"), "Resources vs batch size")),
        ("edge", plots.edge_profiles(rows)),
        ("cdf", plots.latency_cdf(cdf)),
        *(_llm_figures(rows, rep, slo) if llm_rows(rows) else []),
    ]


def _llm_figures(rows: list[ResultRow], rep: Report, slo: Slo | None) -> list[tuple[str, str | None]]:
    """The LLM rows' plots (``farm.readers.report_llm_plots``): latency percentiles vs concurrency and vs rate, tokens/s
    with the knees, goodput vs rate, engines compared."""
    return [("llm-latency-concurrency", llm_plots.latency_vs_load(rows, "concurrency", slo)),
            ("llm-latency-rate", llm_plots.latency_vs_load(rows, "rate", slo)),
            ("llm-tokens-knee", llm_plots.tokens_vs_concurrency(rows, rep.knees)),
            ("llm-goodput", llm_plots.goodput_vs_rate(rows, slo)),
            ("llm-engines", llm_plots.engines(rows))]


def _tools(rows: list[ResultRow]) -> str:
    """The LLM jobs' TTFT, ITL and TPOT p50 (ms) by farm's, vllm bench's, AIPerf's and GuideLLM's definitions, from
    each job's event log (``farm events JOB`` for the p99s and the log itself; docs/llm.md for the definitions)."""
    figures = stored_figures([r.job_id for r in rows if r.llm is not None])
    if not figures:
        return ""
    head = "<tr><th class=l>job</th><th class=l>figure</th>" + "".join(f"<th>{t}</th>" for t in TOOLS) + "</tr>"
    cells = [f"<tr><td class=l><code>{_e(jid[:8])}</code></td><td class=l>{_e(fig.upper())} p50 ms</td>"
             + "".join(f"<td>{'-' if v is None else f'{v:,.2f}'}</td>" for v in by_tool.values()) + "</tr>"
             for jid, figs in figures.items() for fig, by_tool in side_by_side(figs).items()]
    return ('<h2 id="tools">TTFT, ITL and TPOT by tool</h2><p>Each LLM job\'s figures computed from its event log '
            "by each tool's own definition (docs/llm.md), so a row lines up with that tool's number.</p>"
            f'<table id="tools-table">{head}{"".join(cells)}</table>')


def _op_profiles(request_id: str) -> str:
    """The op-type breakdown and top nodes of the jobs profiled with --op-profile (``farm.readers.report_ops``)."""
    with session_scope() as s:
        return report_ops.section(request_profiles(s, request_id))


def _page(title: str, body: str) -> str:
    digest = base64.b64encode(hashlib.sha256(CHECK_JS.encode()).digest()).decode()
    csp = f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n{body}\n"
            f"<script>{CHECK_JS}</script></body></html>\n")


def _how_measured(rows: list[ResultRow]) -> str:
    serving = next((r["measured"] for r in rows if not r.get("edge_profile")), None)
    parts = []
    if serving:
        parts.append(f"serving rows: {_e(serving)}")
    for how in dict.fromkeys(r["measured"] for r in rows if r.get("edge_profile") and r.get("measured")):
        parts.append(f"edge rows: {_e(how or MEASURED_EDGE)}")
    return ('<p class="note"><b>How rows were measured.</b> ' + "; ".join(parts) + ". An edge row pays no "
            "per-request transport cost, so its throughput is not comparable with a serving row's.</p>")


def _summary(rep: Report) -> str:
    """Best per device and engine, top 3 overall, the left-out configurations with reasons, edge verdicts."""
    obj = rep.objective
    cons = ", ".join(map(str, rep.constraints)) or "none"
    best: dict[tuple[str, str], ResultRow] = {}
    for r in rep.ranked:
        best.setdefault((r["device"], r["engine"]), r)
    out = [f"<h2>Summary</h2><p>objective <b>{_e(obj)}</b> ({'higher' if BY_NAME[obj].higher_is_better else 'lower'}"
           f" is better); constraints: {_e(cons)}</p>"]

    def line(r: ResultRow) -> str:
        return (f"<li>{_e(_config(r))}: {_e(fmt_value(obj, r.get(obj)))} {_e(BY_NAME[obj].unit)}, p99 "
                f"{_e(fmt_value('latency_p99_ms', r.get('latency_p99_ms')))} ms</li>")

    out.append("<h3>Best per device and engine</h3><ul>" + "".join(line(r) for r in best.values())
               + ("" if best else "<li>no configuration meets the constraints</li>") + "</ul>")
    out.append('<h3>Top 3 overall</h3><ol id="top3">' + "".join(line(r) for r in rep.ranked[:3]) + "</ol>")
    if rep.rejected:
        out.append("<h3>Left out</h3><ul>" + "".join(f"<li>{_e(_config(r))}: {_e(why)}</li>"
                                                     for r, why in rep.rejected) + "</ul>")
    if rep.knees:
        out.append('<h3>Knees of the concurrency sweeps</h3><ul id="knees">' + "".join(
            f"<li>{_e(name)}: {_e(knee.text())}</li>" for name, knee in rep.knees) + "</ul>")
    if rep.edge:
        def verdict(e: ResultRow) -> str:
            text = ("fits" if e["fits"] else _e(e["reason"]) if e["fits"] is None
                    else f"<span class=bad>does not fit</span> ({_e(e['reason'])})")
            return text + (f"; {_e(llm_edge_figures(e))}" if llm_edge(e) else "")

        out.append('<h3>Edge profiles</h3><ul id="edge-fit">' + "".join(f"<li>{_e(_config(e))}: {verdict(e)}</li>"
                                                                       for e in rep.edge) + "</ul>")
    return "\n".join(out)


def _static(static: dict[str, Any]) -> str:
    if not static:
        return "<h2>Model</h2><p>no static metrics stored (run <code>farm analyze</code>)</p>"
    cells = "".join(f"<tr><td class=l>{_e(m.title)}</td><td>{_e(_num(m.name, static.get(m.name)))}</td>"
                    f"<td class=l>{_e('MiB' if m.unit == 'B' else m.unit)}</td>"
                    f"<td class=l>{_e(m.description)}</td></tr>" for m in MODEL_METRICS if m.name in static)
    head = "<tr><th>metric</th><th>value</th><th>unit</th><th>what</th></tr>"
    return f'<h2>Model</h2><table id="static">{head}{cells}</table>'


def _config_cell(r: ResultRow) -> str:
    """Where a job sits in the matrix, compactly: ``cpu onnxruntime b8×c4@100/s``, its serving
    configuration and edge profile."""
    parts = [f"{r['device']} {r['engine']} b{r['batch_size']}×c{r['concurrency']}{rate_text(r)}"]
    if r.get("edge_profile"):
        parts.append(f"edge {r['edge_profile']}")
    serving = [SERVING_SHORT.get(k, k.replace("_", " ") + " {}").format(r[k]) for k in MEASUREMENT_COLUMNS
               if r.get(k) not in (None, "")]
    if r.get("rpc") and r["rpc"] != "unary":
        serving.append(f"rpc {r['rpc']}")
    if r.get("knobs"):  # an LLM engine's knobs as its server ran (n_threads included)
        serving.append(knobs_text(r["knobs"]))
    if r.get("repeat"):
        serving.append(f"repeat {r['repeat']}")
    return _e(" · ".join(parts + serving))


def _flags(r: ResultRow) -> str:
    """Short host flags (the full sentence as a tooltip) and the error, for the "Every job" table."""
    s = get_settings()  # the bounds of the host notes (drift, busy)
    notes = [("steal", steal_note(r.get("cpu_steal_pct"))),
             *((n.split(":")[0], n) for n in host_notes(r, s.host_drift_pct, s.host_busy_pct)),
             ("shared", "shared its host with another job, not isolated" if shared_unisolated(r) else None)]
    tags = [f'<abbr title="{_e(full)}">{_e(short)}</abbr>' for short, full in notes if full]
    if r.get("error"):
        tags.append(f'<span class="bad">{_e(str(r["error"])[:160])}</span>')
    return "; ".join(tags)


def _jobs(rows: list[ResultRow]) -> str:
    """Two tables: "Every job" (configuration, status, flags and the headline metrics some job measured, for a
    1,400 px window without scrolling) and "All metrics" (every stored value, exact in ``data-value``)."""
    shown = [m for m in (LLM_HEADLINE if llm_rows(rows) else HEADLINE) if any(r.get(m) is not None for r in rows)]
    out = ['<h2>Every job</h2><p>How each row was measured is said above; hover a flag for its sentence. '
           'Every metric of every job is in <a href="#all-metrics">All metrics</a>.</p>'
           '<table id="jobs-summary"><tr><th class=l>job</th><th class=l>configuration</th><th class=l>status</th>'
           + "".join(_head(m) for m in shown) + "<th class=l>flags</th></tr>"]
    for r in rows:
        out.append(f'<tr class="job" id="job-{_e(r["job_id"])}"><td class=l><code>{_e(str(r["job_id"])[:6])}</code>'
                   f'</td><td class=l>{_config_cell(r)}</td><td class=l>{_e(r.get("status"))}</td>'
                   + "".join(f"<td>{_e(_num(m, r.get(m)))}</td>" for m in shown)
                   + f"<td class='l w'>{_flags(r)}</td></tr>")
    out.append("</table>")
    out.append('<h2 id="all-metrics">All metrics</h2><div class="wide"><table id="jobs"><tr><th class=l>job</th>'
               '<th class=l>configuration</th>' + "".join(_head(m) for m in METRIC_NAMES) + "</tr>")
    for r in rows:
        cells = [f"<td class=l><code>{_e(str(r['job_id'])[:6])}</code></td><td class=l>{_config_cell(r)}</td>"]
        cells += [f'<td data-metric="{m}" data-value="{_e(r.get(m))}">{_e(_num(m, r.get(m)))}</td>'
                  for m in METRIC_NAMES]
        out.append(f'<tr data-job="{_e(r["job_id"])}">' + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table></div>"

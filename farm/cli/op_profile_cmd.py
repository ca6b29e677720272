"""``farm ops JOB_ID``: where the time goes inside the model of one job (its ``--op-profile``), and ``farm compare
--ops A B``: which op types got faster or slower between two jobs (``farm.op_profile``)."""
from __future__ import annotations

import csv
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, TypedDict

import typer
from rich import box
from rich.table import Table

from farm import op_profile
from farm.cli.prepare import prepare_db
from farm.cli.views import console, err_console, safe_row, say
from farm.db.session import session_scope
from farm.errors import FarmError, RequestError
from farm.op_layers import LAYER_FORMATS, job_layers, joined, static_layers
from farm.op_profile import StoredJob
from schemas.op_profile import OVERHEAD, Achieved, LayerCost, LayerRow, LayersView, OpProfile

#: the widest a table of these commands gets (columns)
WIDTH = 80
NAME_WIDTH = 30
ATEN = "aten::"


def _shown(text: str) -> str:
    """A node name or op type as the tables show it: TorchScript's ``aten::`` namespace left out (``--json`` and
    ``--csv`` keep it), so that a call-tree path fits: ``conv2d#12/convolution#0``."""
    return text.replace(ATEN, "")


def _short(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters (node names differ at both ends)."""
    text = _shown(text)
    if len(text) <= width:
        return text
    half = (width - 1) // 2
    return f"{text[:half]}…{text[-(width - 1 - half):]}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def say80(line: str) -> None:
    """A free line of these commands, wrapped to the tables' 80 columns."""
    for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_long_words=False):
        say(part)


def header_lines(jid: str, job: StoredJob, prof: OpProfile) -> list[str]:
    """What the profile is and how far its node sum covers the engine's compute time."""
    where = f"{job['engine']} on {job['device']}, batch {job['batch_size']}" + (
        f", edge {job['edge_profile']}" if job.get("edge_profile") else "")
    lines = [f"job {jid}: {where}"]
    if prof.status != "ok":
        lines.append(f"no op profile ({prof.status}): {prof.reason}")
        return lines
    lines.append(f"{prof.iterations} profiled inferences ({prof.warmup} warm-up), threads "
                 f"{prof.threads or 'of the lease'}" + (f", cores {prof.cpus}" if prof.cpus else "")
                 + "; ms per inference")
    if prof.site:
        lines.append(f"taken in: {prof.site}")
    ratio = prof.sum_vs_compute
    lines.append(f"node sum {_ms(prof.node_sum_ms)} ms vs compute {_ms(prof.compute_ms)} ms"
                 + (f" ({100 * ratio:.0f} %)" if ratio is not None else "")
                 + f"; overhead {_ms(prof.overhead_ms)} ms (its own row)")
    served = job.get("server_compute_p50_ms")
    if served is not None and prof.batch_size == job["batch_size"]:
        lines.append(f"the job's server compute p50 under load: {_ms(served)} ms per request")
    if prof.reason:
        lines.append(f"note: {prof.reason}")
    return lines


def nodes_table(prof: OpProfile, top: int) -> Table:
    """The ``top`` nodes by median self time (80 columns)."""
    table = Table(title=f"top {min(top, len(prof.nodes))} of {len(prof.nodes)} nodes", box=box.SIMPLE_HEAD,
                  width=WIDTH, title_justify="left")
    for col, kw in (("node", {"no_wrap": True, "max_width": NAME_WIDTH}), ("op type", {"max_width": 16}),
                    ("p50", {"justify": "right"}), ("p90", {"justify": "right"}), ("share", {"justify": "right"}),
                    ("calls", {"justify": "right"})):
        table.add_column(col, overflow="ellipsis", **kw)
    for n in prof.nodes[:top]:
        mark = "" if n.status == "executed" else f" ({n.status})"
        fused = f" +{len(n.fused)}" if n.fused else ""
        safe_row(table, _short(n.name + fused + mark, NAME_WIDTH), _shown(n.op_type), _ms(n.self_ms_p50),
                 _ms(n.self_ms_p90), _pct(n.share), f"{n.calls:g}")
    return table


def types_table(prof: OpProfile) -> Table:
    """Per op type: nodes, calls, self time and share; the overhead row last."""
    table = Table(title="by op type", box=box.SIMPLE_HEAD, width=WIDTH, title_justify="left")
    for col in ("op type", "nodes", "calls", "ms", "share"):
        table.add_column(col, justify="left" if col == "op type" else "right", overflow="ellipsis")
    for r in op_profile.by_op_type(prof):
        safe_row(table, _shown(r["op_type"]), str(r["nodes"]) if r["op_type"] != OVERHEAD else "-", f"{r['calls']:g}",
                 _ms(r["self_ms"]), _pct(r["share"]))
    return table


CSV_COLUMNS = ("rank", "name", "op_type", "exec_type", "provider", "calls", "self_ms_p50", "self_ms_p90", "share",
               "input_shapes", "fused", "status")


def _csv(prof: OpProfile) -> None:
    w = csv.writer(sys.stdout)
    w.writerow(CSV_COLUMNS)
    for i, n in enumerate(prof.nodes):
        d = n.model_dump()
        w.writerow([i, *(";".join(d[c]) if c == "fused" else d[c] for c in CSV_COLUMNS[1:])])
    if prof.overhead_ms is not None:
        w.writerow([-1, OVERHEAD, OVERHEAD, "", "", 1, prof.overhead_ms, "", "", "", "", "overhead"])


def ops_cmd(
    job_id: str = typer.Argument(..., help="The job id (`farm results` shows it; a unique prefix will do)."),
    top: int = typer.Option(15, "--top", min=1, help="How many nodes the table shows."),
    as_json: bool = typer.Option(False, "--json", help="The whole profile as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Every node as CSV (the overhead row last)."),
    trace_out: Path | None = typer.Option(None, "--trace", help="Write the raw trace here (Chrome trace JSON: "
                                          "open it in ui.perfetto.dev or chrome://tracing)."),
    flops: bool = typer.Option(True, "--flops/--no-flops", help="Join the model's per-node static FLOP: achieved "
                               "GFLOP/s per node and in total, against the device's peak."),
    peak_gflops: float | None = typer.Option(None, "--peak-gflops", min=0.0, help="The device's peak GFLOP/s "
                                             "(else the one the pass measured, or a GPU's datasheet figure)."),
) -> None:
    """Where the time goes inside the model of one job: its top nodes and op types (`farm submit --op-profile`)."""
    if as_json and as_csv:
        raise RequestError("give one of --json and --csv")
    prepare_db()
    with session_scope() as s:
        stored = op_profile.load(s, job_id)
        raw = op_profile.trace(s, stored.job_id) if trace_out is not None else None
    if trace_out is not None and raw is not None:
        trace_out.write_bytes(raw)
        say(f"trace written to {trace_out} ({len(raw) / 2**20:.1f} MiB): open it in ui.perfetto.dev", to=err_console)
    prof = stored.profile
    if as_json:
        extra: LayersView | LayersError | dict[str, object] = (_quiet_layers(stored, peak_gflops)
                                                                if flops and prof.status == "ok" else {})
        print(json.dumps({"job_id": stored.job_id, "job": stored.job, "profile": prof.model_dump(),
                          "op_types": op_profile.by_op_type(prof), "has_trace": stored.has_trace, **extra},
                         indent=2))
        return
    if as_csv:
        _csv(prof)
        return
    for line in header_lines(stored.job_id, stored.job, prof):
        say80(line)
    if prof.status == "ok":
        console.print(nodes_table(prof, top))
        console.print(types_table(prof))
        if flops:
            roofline(stored, top, peak_gflops)
        if stored.has_trace and trace_out is None:
            say80(f"raw trace: farm ops {stored.job_id[:12]} --trace t.json (open it in ui.perfetto.dev)")


class LayersError(TypedDict):
    """Why ``--json`` has no ``layers`` and ``total``."""

    layers_error: str


def _quiet_layers(stored: op_profile.Stored, peak_gflops: float | None) -> LayersView | LayersError:
    """``--json``'s ``layers`` and ``total`` (or ``layers_error``: why they are missing)."""
    try:
        return job_layers(stored, peak_gflops)
    except FarmError as exc:
        return LayersError(layers_error=str(exc).splitlines()[0])


def compare_ops_cmd(job_a: str, job_b: str, as_json: bool) -> None:
    """``farm compare --ops A B``: op types of two jobs' profiles, the largest change first."""
    prepare_db()
    with session_scope() as s:
        a, b = op_profile.load(s, job_a), op_profile.load(s, job_b)
    for side in (a, b):
        if side.profile.status != "ok":
            raise RequestError(f"job {side.job_id} has no usable op profile ({side.profile.status}: "
                               f"{side.profile.reason})")
    rows = op_profile.compare_ops(a.profile, b.profile)
    if as_json:
        print(json.dumps({"a": a.job_id, "b": b.job_id, "op_types": rows}, indent=2))
        return
    say80(f"B {b.job_id[:12]} ({b.job['engine']}, batch {b.job['batch_size']}) against A {a.job_id[:12]} "
        f"({a.job['engine']}, batch {a.job['batch_size']}); ms per inference")
    table = Table(box=box.SIMPLE_HEAD, width=WIDTH)
    for col in ("op type", "A ms", "B ms", "B / A", "B - A ms", "verdict"):
        table.add_column(col, justify="left" if col in ("op type", "verdict") else "right", overflow="ellipsis")
    for r in rows:
        ratio = r["ratio"]
        verdict = ("only in A" if r["b_ms"] is None else "only in B" if r["a_ms"] is None else
                   "faster" if ratio is not None and ratio < 0.9 else "slower" if ratio is not None and ratio > 1.1
                   else "same")
        safe_row(table, _shown(r["op_type"]), _ms(r["a_ms"]), _ms(r["b_ms"]), "-" if ratio is None else f"{ratio:.2f}",
                 _ms(r["delta_ms"]), verdict)
    console.print(table)
    say80("faster / slower: B / A beyond ±10 % on one profile each (not a test over runs: compare requests with "
        "--repeats for that)")


def layers_cmd(model: Path, model_format: str, inputs: list[Any], batch: int, job: str | None,
               peak_gflops: float | None, as_json: bool) -> None:
    """``farm analyze MODEL --layers [--job JOB]``: the layer-wise static view, joined with a job's profile."""
    if model_format not in LAYER_FORMATS:
        raise RequestError(f"--layers reads ONNX and TorchScript models; {model.name} is {model_format}: export it "
                           "to ONNX, or read `farm ops JOB` alone")
    prof = None
    if job is not None:
        prepare_db()
        with session_scope() as s:
            stored = op_profile.load(s, job)
        if stored.profile.status != "ok":
            raise RequestError(f"job {stored.job_id} has no usable op profile: {stored.profile.reason}")
        prof, batch = stored.profile, stored.profile.batch_size
    static = static_layers(model, model_format, inputs, batch)
    if prof is None:
        if as_json:
            print(json.dumps({"batch_size": batch, "layers": static, "total": None}, indent=2))
            return
        console.print(static_table(f"{model.name}, batch {batch}", static))
        return
    got = joined(static, prof, peak_gflops)
    if as_json:
        print(json.dumps({"batch_size": batch, **got}, indent=2))
        return
    console.print(layers_table(f"{model.name}, batch {batch} (joined with the op profile)", got["layers"]))
    for line in total_lines(got["total"]):
        say80(line)


def _layer_table(title: str, heads: tuple[str, ...]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, width=WIDTH, title_justify="left")
    for col in heads:
        table.add_column(col, justify="left" if col in ("node", "op type") else "right", overflow="ellipsis",
                         no_wrap=col == "node", max_width=NAME_WIDTH if col == "node" else None)
    return table


def layers_table(title: str, rows: list[LayerRow], top: int | None = None) -> Table:
    """Per profiled node: time, FLOP and the achieved GFLOP/s and GB/s (the static costs joined)."""
    table = _layer_table(title, ("node", "op type", "ms", "MFLOP", "GFLOP/s", "GB/s"))
    for r in rows[:top]:
        safe_row(table, _short(r["name"], NAME_WIDTH), _shown(r["op_type"]), _ms(r["self_ms"]),
                 _num(r["flops"], 1e6, 2), _num(r["gflops_per_s"], 1, 1), _num(r["gbytes_per_s"], 1, 2))
    return table


def static_table(title: str, rows: list[LayerCost]) -> Table:
    """Per graph node: its static costs (no profile): FLOP, parameters, output KiB."""
    table = _layer_table(title, ("node", "op type", "MFLOP", "params", "out KiB"))
    for r in rows:
        safe_row(table, _short(r["name"], NAME_WIDTH), _shown(r["op_type"]), _num(r["flops"], 1e6, 2),
                 f"{r['params']:,}", _num(r["activation_bytes"], 1024, 1))
    return table


def total_lines(total: Achieved) -> list[str]:
    """The model's achieved FLOP rate and its share of the device's peak (or why that share is unknown)."""
    line = (f"model: {_num(total['flops'], 1e9, 3)} GFLOP per call in {_ms(total['compute_ms'])} ms = "
            f"{_num(total['gflops_per_s'], 1, 1)} GFLOP/s")
    if total["peak_gflops"] is None:
        return [line + "; device peak unknown (give --peak-gflops N for its share)"]
    share = "-" if total["of_peak"] is None else f"{100 * total['of_peak']:.1f} %"
    lines = [f"{line}, {share} of the device's peak {total['peak_gflops']:,.1f} GFLOP/s",
             f"peak: {total['peak_source']}"]
    if total["of_peak"] is not None and total["of_peak"] > 1.0:
        lines.append("above the peak: the peak is a GEMM's reach at the moments it was measured, and the host's "
                     "speed moved between them and the inferences (or the engine's kernels beat numpy's BLAS); "
                     "read it as at the peak, not beyond it")
    return lines


def roofline(stored: op_profile.Stored, top: int, peak_gflops: float | None) -> LayersView | None:
    """``farm ops``' static-meets-measured part: the per-node achieved rates and the total, printed (None and a
    line saying why when the model's static costs cannot be had here)."""
    try:
        got = job_layers(stored, peak_gflops)
    except FarmError as exc:
        say80(f"achieved GFLOP/s: not available ({str(exc).splitlines()[0]})")
        return None
    console.print(layers_table(f"achieved, top {min(top, len(got['layers']))} (static FLOP over the node's time)",
                               got["layers"], top=top))
    for line in total_lines(got["total"]):
        say80(line)
    return got


def _num(v: float | None, unit: float, digits: int) -> str:
    return "-" if v is None else f"{v / unit:,.{digits}f}"


def register(app: typer.Typer) -> None:
    app.command("ops")(ops_cmd)

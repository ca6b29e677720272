"""``farm compare A B``: two requests matched configuration by configuration, judged on the variation between
their runs (``farm.compare``)."""
from __future__ import annotations

import json

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from farm.cli.op_profile_cmd import compare_ops_cmd
from farm.cli.prepare import prepare_db
from farm.cli.views import console, err_console, fmt_value, load_label, safe_row, say
from farm.compare import FASTER, MIN_REPEATS, RATIOS, SLOWER, Comparison
from farm.compare import as_json as comparison_json
from farm.compare import compare as run_compare
from farm.errors import RequestError
from farm.results import CONFIG_COLUMNS, find_request, result_rows
from schemas.measured import how_measured_short


def compare(
    request_a: str = typer.Argument(..., help="The baseline request id (or a unique prefix)."),
    request_b: str = typer.Argument(..., help="The request compared against it."),
    fail_on_regression: float | None = typer.Option(
        None, "--fail-on-regression", metavar="PCT",
        help="Exit 1 when a matched configuration is conclusively slower by PCT % or more (a CI gate); "
             "inconclusive ones never fail it."),
    min_effect: float = typer.Option(5.0, "--min-effect", metavar="PCT", min=0.0,
                                     help="Smallest change of the run medians (%) called faster/slower; smaller "
                                          "ones are the same."),
    alpha: float = typer.Option(0.05, "--alpha", min=1e-9, max=0.5,
                                help="Significance level of the Mann-Whitney test over the runs."),
    ignore: list[str] | None = typer.Option(None, "--ignore", help="A coordinate not to match on, e.g. engine "
                                            "to compare two engines; repeat."),
    as_json: bool = typer.Option(False, "--json"),
    ops: bool = typer.Option(False, "--ops", help="A and B are job ids: which op types got faster or slower "
                             "between their op profiles (--op-profile)."),
) -> None:
    """Compare two requests configuration by configuration: ratios B / A and a verdict from their repeated runs
    (faster, slower, same or inconclusive)."""
    if ops:
        compare_ops_cmd(request_a, request_b, as_json)
        return
    ignored = tuple(ignore or [])
    unknown = [c for c in ignored if c not in CONFIG_COLUMNS]
    if unknown:
        raise RequestError(f"--ignore {unknown[0]!r} is not a coordinate; use one of {', '.join(CONFIG_COLUMNS)}")
    if fail_on_regression is not None and fail_on_regression < 0:
        raise RequestError("--fail-on-regression takes a percentage >= 0, e.g. 5")
    prepare_db()
    a, b = find_request(request_a).id, find_request(request_b).id
    result = run_compare(result_rows(a), result_rows(b), ignored, min_effect, alpha)
    if as_json:
        print(json.dumps(comparison_json(result, a, b), indent=2, default=str))
    else:
        _print(result, a, b)
    if fail_on_regression is not None:
        bad = result.regressions(fail_on_regression)
        if bad:
            err_console.print(f"[red]{len(bad)} configuration(s) regressed by {fail_on_regression:g} % or more "
                              "with significance[/]", highlight=False)
            raise typer.Exit(1)


def _coords(key: dict[str, object]) -> str:
    """A configuration's coordinates, short: device engine bxc [edge] [dims]."""
    parts = [str(key.get(c)) for c in ("device", "engine") if c in key]
    if "batch_size" in key and "concurrency" in key:
        parts.append(load_label(key))
    if key.get("edge_profile"):
        parts.append(f"edge {key['edge_profile']}")
    dims = [f"{c}={key[c]}" for c in ("instances", "threads", "max_queue_delay_us", "preferred_batch_size")
            if key.get(c) is not None]
    return " ".join(parts + dims)


def _print(c: Comparison, a: str, b: str) -> None:
    """The comparison table, how to read it, then the unmatched configurations of each side."""
    table = Table(title=f"{b} against {a} (ratios B / A of the run medians)", box=box.SIMPLE_HEAD)
    for col in ("configuration", "measured", "runs", *(label for _, label in RATIOS), "tests (change, p)",
                "verdict"):
        table.add_column(col)
    for m in c.matches:
        tests = "; ".join(f"{'thr' if t.metric.startswith('throughput') else 'p50'}{'*' if t.primary else ''} "
                          f"{t.change_pct:+.1f}% p={t.p_value:.2g}" for t in m.tests)
        colour = "red" if m.verdict == SLOWER else "green" if m.verdict == FASTER else ""
        verdict = m.verdict + (f" ({m.reason})" if m.reason else "")
        flags = [] if m.reason == "; ".join(m.flags) else m.flags  # already the reason: not twice
        safe_row(table, _coords(m.key), how_measured_short(bool(m.a.get("edge_profile"))), f"{m.n_a}/{m.n_b}",
                 *(fmt_value("", m.ratios[label]) + ("x" if m.ratios[label] is not None else "")
                   for _, label in RATIOS),
                 tests or "-", _verdict_cell(verdict, colour, flags))
    console.print(table)
    console.print(f"runs A/B: succeeded runs per side (--repeats). faster/slower: a Mann-Whitney test over the "
                  f"per-run values gives p < {c.alpha:g} and the medians differ by at least {c.min_effect_pct:g} %; "
                  "same: otherwise; inconclusive: under "
                  f"{MIN_REPEATS} runs a side, too few runs for the test to reach p < {c.alpha:g}, a host flag on a "
                  "run (speed drift or foreign load over 10 %), or a failed side. The starred test decides: "
                  "throughput, p50 latency in open loop. Edge rows are in-process (no transport): compare them "
                  "only with edge rows.", highlight=False)
    for side, rows in (("A", c.only_a), ("B", c.only_b)):
        if rows:
            say(f"only in {side} ({a if side == 'A' else b}), not compared: "
                + "; ".join(f"{r['job_id'][:6]} {_coords(r)} {r['status']}" for r in rows))


def register(app: typer.Typer) -> None:
    app.command()(compare)


def _verdict_cell(verdict: str, colour: str | None, flags: list[str]) -> Text:
    """The verdict in its colour, then the match's host flags (drift, busy) in yellow."""
    cell = Text(verdict, style=colour or "")
    if flags:
        cell.append(f" (host {', '.join(flags)})", style="yellow")
    return cell

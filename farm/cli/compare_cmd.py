"""``farm compare A B``: two requests matched configuration by configuration, judged on the variation between
their runs (``farm.compare``)."""
from __future__ import annotations

import json

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from farm.cli.followups import next_hint
from farm.cli.op_profile_cmd import compare_ops_cmd
from farm.cli.prepare import prepare_db
from farm.cli.request_options import ID_ARGS, ID_HELP, request_ids
from farm.cli.views import console, err_console, fmt_value, load_label, safe_row, say, serving_label
from farm.compare import FASTER, MIN_REPEATS, SLOWER, Comparison
from farm.compare import as_json as comparison_json
from farm.compare import compare as run_compare
from farm.errors import RequestError
from farm.results import CONFIG_COLUMNS, find_request, result_rows
from schemas.measured import how_measured_short
from schemas.metrics import BY_NAME


def ratio_head(metric: str) -> str:
    """A ratio column's header: the metric's short label without its unit (the cells are ratios B / A)."""
    return "tok/s" if metric == "output_tokens_per_s" else BY_NAME[metric].label.split()[0]


#: a test's metric, short, in the wide table's tests column
TEST_SHORT = {"throughput_infer_per_s": "thr", "latency_p50_ms": "p50", "output_tokens_per_s": "tok/s",
              "ttft_p50_ms": "ttft", "itl_p50_ms": "itl", "tpot_p50_ms": "tpot"}


def compare(
    request_a: str = typer.Argument(..., callback=request_ids, help="The baseline request. " + ID_HELP),
    request_b: str = typer.Argument(..., callback=request_ids, help="The request compared against it."),
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
    wide: bool = typer.Option(False, "--wide", help="Add how each configuration was measured and each test's "
                              "change and p-value (the default table fits 80 columns)."),
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
        _print(result, a, b, wide)
        next_hint(f"farm compare {a[:8]} {b[:8]} --wide (the tests)" if not wide else
                  f"farm report {b[:8]} -o report.html", f"farm results {b[:8]}")
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
    serving = serving_label(key)  # instances, threads, batching: only where not the plain ones
    return " ".join(parts + ([] if serving == "-" else [serving]))


def _print(c: Comparison, a: str, b: str, wide: bool = False) -> None:
    """The comparison table (80 columns; ``wide``: with how measured and the tests), how to read it, then the
    unmatched configurations of each side."""
    table = Table(title=f"{b[:8]} against {a[:8]} (ratios B / A of the run medians)", box=box.SIMPLE_HEAD,
                  pad_edge=False, padding=(0, 1))
    table.add_column("configuration", overflow="fold")
    if wide:
        table.add_column("measured")
    table.add_column("runs", no_wrap=True)
    for metric, _ in c.ratios:
        table.add_column(ratio_head(metric), justify="right", no_wrap=True)
    if wide:
        table.add_column("tests (change, p)")
    table.add_column("verdict", overflow="fold")
    for m in c.matches:
        tests = "; ".join(f"{TEST_SHORT.get(t.metric, t.metric)}{'*' if t.primary else ''} "
                          f"{t.change_pct:+.1f}% p={t.p_value:.2g}" for t in m.tests)
        colour = "red" if m.verdict == SLOWER else "green" if m.verdict == FASTER else ""
        verdict = m.verdict + (f" ({m.reason})" if m.reason else "")
        flags = [] if m.reason == "; ".join(m.flags) else m.flags  # already the reason: not twice
        safe_row(table, _coords(m.key), *((how_measured_short(bool(m.a.get("edge_profile"))),) if wide else ()),
                 f"{m.n_a}/{m.n_b}", *(fmt_value("", m.ratios[label]) for _, label in c.ratios),
                 *((tests or "-",) if wide else ()), _verdict_cell(verdict, colour, flags, wide))
    console.print(table)
    console.print(f"runs A/B: succeeded runs per side (--repeats). faster/slower: a Mann-Whitney test over the "
                  f"per-run values gives p < {c.alpha:g} and the medians differ by at least {c.min_effect_pct:g} %; "
                  "same: otherwise; inconclusive: under "
                  f"{MIN_REPEATS} runs a side, too few runs for the test to reach p < {c.alpha:g}, a host flag on a "
                  "run (speed drift or foreign load over 10 %), or a failed side. The starred test decides: "
                  "throughput (LLM rows: output tokens/s), p50 latency (LLM rows: TTFT p50) in open loop. "
                  "Edge rows are in-process (no transport): compare them "
                  "only with edge rows.", highlight=False)
    for side, rows in (("A", c.only_a), ("B", c.only_b)):
        if rows:
            say(f"only in {side} ({a if side == 'A' else b}), not compared: "
                + "; ".join(f"{r['job_id'][:6]} {_coords(r)} {r['status']}" for r in rows))


def register(app: typer.Typer) -> None:
    app.command(context_settings=ID_ARGS)(compare)  # -1, -2: request ids


def _verdict_cell(verdict: str, colour: str | None, flags: list[str], wide: bool = True) -> Text:
    """The verdict in its colour, then the match's host flags (drift, busy) in yellow: each one (``wide``), or
    how many runs have one."""
    cell = Text(verdict, style=colour or "")
    if flags and wide:
        cell.append(f" (host {', '.join(flags)})", style="yellow")
    elif flags:
        runs = len({" ".join(f.split()[:2]) for f in flags})  # "A 1a2b3c drift -14%": side and job
        cell.append(f" (host flags on {runs} run(s): --wide)", style="yellow")
    return cell

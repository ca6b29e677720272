"""``farm compare A B``: two requests matched configuration by configuration, judged on the variation between
their runs (``farm.readers.compare``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from farm.cli import interleave_cmd, remote, submit_options
from farm.cli.followups import next_hint
from farm.cli.op_profile_cmd import compare_ops_cmd
from farm.cli.prepare import prepare_db
from farm.cli.request_options import ID_ARGS, ID_HELP, request_ids
from farm.cli.views import console, err_console, fmt_value, load_label, safe_row, say, serving_label
from farm.errors import RequestError
from farm.readers.compare import FASTER, MIN_REPEATS, SLOWER, Comparison
from farm.readers.compare import as_json as comparison_json
from farm.readers.compare import compare as run_compare
from farm.readers.results import CONFIG_COLUMNS, find_request, result_rows
from farm.readers.rows import ResultRow
from farm.settings import get_settings
from schemas.measured import how_measured_short
from schemas.metrics import BY_NAME


def ratio_head(metric: str) -> str:
    """A ratio column's header: the metric's short label without its unit (the cells are ratios B / A)."""
    return "tok/s" if metric == "output_tokens_per_s" else BY_NAME[metric].label.split()[0]


#: a test's metric, short, in the wide table's tests column
TEST_SHORT = {"throughput_infer_per_s": "thr", "latency_p50_ms": "p50", "output_tokens_per_s": "tok/s",
              "ttft_p50_ms": "ttft", "itl_p50_ms": "itl", "tpot_p50_ms": "tpot"}


@submit_options.with_options(interleave_cmd.CELL_OPTIONS)  # the cell of --interleaved, as farm submit has them
def compare(
    request_a: str = typer.Argument(..., callback=request_ids, help="The baseline request (with --interleaved: "
                                    "the OLD model file). " + ID_HELP),
    request_b: str = typer.Argument(..., callback=request_ids, help="The request compared against it (with "
                                    "--interleaved: the NEW model file)."),
    fail_on_regression: float | None = typer.Option(
        None, "--fail-on-regression", metavar="PCT",
        help="Exit 1 when a matched configuration is conclusively slower by PCT % or more (a CI gate); "
             "inconclusive ones never fail it."),
    min_effect: float | None = typer.Option(None, "--min-effect", metavar="PCT", min=0.0,
                                            help="Smallest change (%) called faster/slower; smaller ones are the "
                                                 "same (default 5: the run medians; --interleaved 2: the median "
                                                 "pair ratio)."),
    alpha: float = typer.Option(0.05, "--alpha", min=1e-9, max=0.5,
                                help="Significance level of the Mann-Whitney test over the runs."),
    ignore: list[str] | None = typer.Option(None, "--ignore", help="A coordinate not to match on, e.g. engine "
                                            "to compare two engines; repeat."),
    as_json: bool = typer.Option(False, "--json"),
    wide: bool = typer.Option(False, "--wide", help="Add how each configuration was measured and each test's "
                              "change and p-value (the default table fits 80 columns)."),
    ops: bool = typer.Option(False, "--ops", help="A and B are job ids: which op types got faster or slower "
                             "between their op profiles (--op-profile)."),
    interleaved: bool = typer.Option(False, "--interleaved", help="A and B are model files: measure them here, "
                                     "alternately in short blocks on the same cores, one cell (the options of "
                                     "farm submit below), and judge the pairs (docs/trust.md)."),
    budget_s: float = typer.Option(60.0, "--budget-s", min=1.0, help="--interleaved: the longest it measures, s "
                                   "(leasing cores and loading both models come on top); it stops sooner once the "
                                   "verdict is conclusive."),
    block_ms: float = typer.Option(100.0, "--block-ms", min=20.0, max=10000.0,
                                   help="--interleaved: the length of one block of load, ms."),
    figure: Path | None = typer.Option(None, "--host-figure", metavar="FILE", help="--interleaved REF MODEL: write "
                                       "MODEL's cost in units of REF on this host there (the whole budget "
                                       "measured), for lining hosts up with --hosts."),
    across: bool = typer.Option(False, "--hosts", help="A and B are host figure files (--host-figure) of one "
                                "model from two hosts: its cost in reference units on B against A."),
    alternate: bool = typer.Option(False, "--alternate-start", help="--interleaved: load each model for its block "
                                   "only (the mode taken when both do not fit in memory at once)."),
    **cell: Any,
) -> None:
    """Compare two requests configuration by configuration: ratios B / A and a verdict from their repeated runs
    (faster, slower, same or inconclusive); with --interleaved, two models measured alternately here."""
    if fail_on_regression is not None and fail_on_regression < 0:
        raise RequestError("--fail-on-regression takes a percentage >= 0, e.g. 5")
    if across:
        interleave_cmd.hosts(Path(request_a), Path(request_b), alpha, 2.0 if min_effect is None else min_effect,
                             fail_on_regression, as_json)
        return
    if figure is not None and not interleaved:
        raise RequestError("--host-figure is written by an interleaved compare: farm compare --interleaved REF MODEL "
                           "--host-figure FILE")
    if interleaved:
        settings = interleave_cmd.Settings(budget_s, block_ms / 1000.0, alpha,
                                           2.0 if min_effect is None else min_effect, alternate)
        interleave_cmd.interleaved(request_a, request_b, cell, fail_on_regression, settings, as_json, figure)
        return
    given = [o for o in interleave_cmd.CELL_OPTIONS if cell.get(o) not in (None, [])]
    if given:
        raise RequestError(f"--{given[0].replace('_', '-')} sets the cell of --interleaved; two requests are "
                           "compared on their own cells")
    if ops:
        compare_ops_cmd(request_a, request_b, as_json)
        return
    ignored = tuple(ignore or [])
    unknown = [c for c in ignored if c not in CONFIG_COLUMNS]
    if unknown:
        raise RequestError(f"--ignore {unknown[0]!r} is not a coordinate; use one of {', '.join(CONFIG_COLUMNS)}")
    (a, rows_a), (b, rows_b) = _rows(request_a), _rows(request_b)
    result = run_compare(rows_a, rows_b, ignored, 5.0 if min_effect is None else min_effect, alpha)
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


def _rows(request_id: str) -> tuple[str, list[ResultRow]]:
    """The request's full id and result rows, from the database or, in a shared farm, from farm's API."""
    if get_settings().remote:
        data = remote.rows_of(remote.Api(), request_id)
        return data.request_id, data.rows
    prepare_db()
    rid = find_request(request_id).id
    return rid, result_rows(rid)


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

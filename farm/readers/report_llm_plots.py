"""The HTML report's plots of LLM rows (the OpenAI client's), drawn like ``farm.readers.report_plots`` (inline SVG, axis
labels from the metric registry, the same size and text rules): TTFT and TPOT percentiles against the load,
output tokens/s against concurrency with each sweep's knee marked (``farm.readers.knee``), goodput against the offered
rate with the SLO's goal, and a per engine x knobs comparison. Each returns None when the rows hold nothing for it.

A sweep is one ``farm.readers.knee.sweep_key`` (device, engine, knobs asked, edge profile); closed-loop rows are
plotted against concurrency, open-loop rows against their offered rate (requests/s).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from farm.readers.knee import KNEE_GAIN_PCT, KNEE_METRIC, Knee, sweep_key, sweep_label
from farm.readers.report_plots import MAX_WIDTH_IN, SMALL_PT, _log_if_wide, _plain_axis, label, to_svg
from farm.readers.rows import ResultRow, as_rows
from schemas.llm import Slo

#: the percentiles drawn per latency figure, with their line styles
PERCENTILES: tuple[tuple[str, Literal["-", "--", ":"]], ...] = (("p50", "-"), ("p90", "--"), ("p99", ":"))
#: the share of requests inside the SLO a rate must keep to count as sustained (the max-goodput search's goal), %
GOODPUT_GOAL_PCT = 95.0


def _short(v: float) -> str:
    """A figure on a plot: whole numbers from 100 up (``1,241``), three significant digits below (``42.2``)."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _llm(rows: Iterable[ResultRow]) -> list[ResultRow]:
    """The succeeded serving rows of the OpenAI client (no edge run)."""
    return [r for r in as_rows(rows) if r.succeeded and not r.is_edge
            and r.get("output_tokens_per_s") is not None]


def _sweeps(rows: list[ResultRow], load: str) -> dict[str, list[ResultRow]]:
    """``rows`` by sweep label, each sorted by ``load`` (``concurrency``: closed-loop rows; ``rate``: open loop)."""
    out: dict[str, list[ResultRow]] = {}
    for r in rows:
        if (r.get("rate") is None) == (load == "concurrency"):
            out.setdefault(sweep_label(sweep_key(r)), []).append(r)
    return {k: sorted(v, key=lambda r: r[load] or 0) for k, v in sorted(out.items())}


def _x_axis(ax: Axes, load: str, xs: Iterable[float]) -> None:
    _log_if_wide(ax, xs, "x")
    ax.set_xlabel("offered rate (requests/s, Poisson)" if load == "rate" else "concurrency (requests in flight)")


def latency_vs_load(rows: list[ResultRow], load: str, slo: Slo | None = None) -> str | None:
    """TTFT and TPOT p50/p90/p99 against ``load`` (``concurrency`` or ``rate``), one colour per sweep, one line
    style per percentile; the SLO's TTFT and TPOT goals as horizontal lines."""
    sweeps = _sweeps(_llm(rows), load)
    if not sweeps or all(len(v) < 2 for v in sweeps.values()):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 4.6), squeeze=False, layout="constrained")
    colours = {name: f"C{i}" for i, name in enumerate(sweeps)}
    for ax, figure, goal in zip(axes[0], ("ttft", "tpot"), ("ttft_ms", "tpot_ms"), strict=True):
        values = []
        for name, group in sweeps.items():
            for pct, style in PERCENTILES:
                pts = [(r[load], r[f"{figure}_{pct}_ms"]) for r in group if r.get(f"{figure}_{pct}_ms") is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), linestyle=style, marker="o", markersize=3, color=colours[name])
                    values += [p[1] for p in pts]
        limit = getattr(slo, goal) if slo else None
        if limit:
            ax.axhline(limit, color="tab:red", linewidth=1.2)
            ax.annotate(f"SLO {limit:g} ms", (0.01, limit), xycoords=("axes fraction", "data"), color="tab:red",
                        fontsize=SMALL_PT, xytext=(0, 3), textcoords="offset points")
            values.append(limit)
        _x_axis(ax, load, (r[load] for g in sweeps.values() for r in g))
        _log_if_wide(ax, values, "y")
        ax.set(title=f"{figure.upper()} percentiles vs {'rate' if load == 'rate' else 'concurrency'}",
               ylabel=label(f"{figure}_p50_ms").replace("p50 ", ""))
    handles = [Line2D([], [], color=colours[n], marker="o", label=n) for n in sweeps]
    handles += [Line2D([], [], color="0.3", linestyle=s, label=p) for p, s in PERCENTILES]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(6, len(handles)))
    return to_svg(fig)


def tokens_vs_concurrency(rows: list[ResultRow], knees: list[tuple[str, Knee]]) -> str | None:
    """Output tokens/s against concurrency, one line per sweep, each sweep's knee marked and labelled."""
    sweeps = _sweeps(_llm(rows), "concurrency")
    if not sweeps or all(len(v) < 2 for v in sweeps.values()):
        return None
    fig, ax = plt.subplots(figsize=(9, 4.8), layout="constrained")
    marks = dict(knees)
    for i, (name, group) in enumerate(sweeps.items()):
        ax.plot([r["concurrency"] for r in group], [r[KNEE_METRIC] for r in group], marker="o", color=f"C{i}",
                label=name)
        knee = marks.get(name)
        if knee is not None:
            ax.plot([knee.concurrency], [knee.tokens_per_s], marker="*", markersize=16, color=f"C{i}",
                    markeredgecolor="black", linestyle="none")
            ax.annotate(f"knee c={knee.concurrency:g}: {_short(knee.tokens_per_s)} tok/s",
                        (knee.concurrency, knee.tokens_per_s), xytext=(6, -14), textcoords="offset points",
                        fontsize=SMALL_PT)
    _x_axis(ax, "concurrency", (r["concurrency"] for g in sweeps.values() for r in g))
    _plain_axis(ax, "y")
    ax.set(title=f"Output tokens/s vs concurrency (★ knee: the last point before a doubling gains under "
                 f"{KNEE_GAIN_PCT:g} %)", ylabel=label(KNEE_METRIC), ylim=(0, None))
    fig.legend(loc="outside right center")
    return to_svg(fig)


def goodput_vs_rate(rows: list[ResultRow], slo: Slo | None = None) -> str | None:
    """Goodput (requests/s inside the SLO) against the offered rate per sweep, with the offered rate itself (the
    diagonal: every request inside the SLO) and the goal line at :data:`GOODPUT_GOAL_PCT` of it."""
    sweeps = _sweeps([r for r in _llm(rows) if r.get("goodput_req_per_s") is not None], "rate")
    if not sweeps:
        return None
    fig, ax = plt.subplots(figsize=(9, 4.8), layout="constrained")
    top = max(r["rate"] for g in sweeps.values() for r in g)
    ax.plot([0, top], [0, top], color="0.5", linewidth=1, label="offered rate (all requests inside the SLO)")
    ax.plot([0, top], [0, top * GOODPUT_GOAL_PCT / 100], color="tab:red", linestyle="--", linewidth=1,
            label=f"SLO goal: {GOODPUT_GOAL_PCT:g} % of requests inside it")
    for i, (name, group) in enumerate(sweeps.items()):
        ax.plot([r["rate"] for r in group], [r["goodput_req_per_s"] for r in group], marker="o", color=f"C{i}",
                label=name)
    given = slo.model_dump() if slo else {}
    goals = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in given.items() if v)
    _plain_axis(ax, "x")
    _plain_axis(ax, "y")
    ax.set(title=f"Goodput vs offered rate (SLO: {goals or 'as submitted'})", xlabel="offered rate (requests/s)",
           ylabel=label("goodput_req_per_s"), xlim=(0, None), ylim=(0, None))
    fig.legend(loc="outside lower center", ncol=2)
    return to_svg(fig)


def engines(rows: list[ResultRow]) -> str | None:
    """Per engine x knobs: the peak output tokens/s of its closed-loop rows, and its TTFT p50 at its lightest
    load (the lowest concurrency measured), as grouped horizontal bars."""
    sweeps = {k: v for k, v in _sweeps(_llm(rows), "concurrency").items() if v}
    if len(sweeps) < 2:
        return None
    names = list(sweeps)
    ys = list(range(len(names)))
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 1.8 + 0.45 * len(names)), squeeze=False,
                             layout="constrained")
    peak = [max(r[KNEE_METRIC] for r in g) for g in sweeps.values()]
    light = [g[0].get("ttft_p50_ms") or 0 for g in sweeps.values()]
    for ax, vals, metric, title in ((axes[0][0], peak, KNEE_METRIC, "peak output tokens/s (any concurrency)"),
                                    (axes[0][1], light, "ttft_p50_ms", "TTFT p50 at the lightest load")):
        bars = ax.barh(ys, vals, color=[f"C{i}" for i in ys])
        ax.bar_label(bars, [_short(v) for v in vals], padding=3, fontsize=SMALL_PT)
        ax.set_yticks(ys, names if ax is axes[0][0] else [""] * len(ys), fontsize=SMALL_PT)
        ax.invert_yaxis()
        _plain_axis(ax, "x")
        ax.set(title=title, xlabel=label(metric))
        ax.margins(x=0.15)
    fig.suptitle("Engines and knobs compared")
    return to_svg(fig)

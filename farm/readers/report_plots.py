"""The HTML report's plots, drawn with matplotlib to inline SVG (no JavaScript, no fonts or files to fetch).

Each function takes result rows (``farm.readers.results.result_rows``) and returns an SVG string, or None when the
rows hold nothing to plot. Axes carry their titles and units from the metric registry
(``Metric.axis_label``); an axis of points (not of bar lengths) whose values span more than a decade is
logarithmic, ticked at 1-2-5 steps in plain numbers; legends sit outside the data.

Sizes are chosen for the page as rendered: a figure is at most 12.5 in wide (1,200 CSS px, so a 1,400 px
window shows it unscaled) and no text is smaller than 8.5 pt (11.3 px); the browser test measures both.
"""
from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: draw to memory
import matplotlib.pyplot as plt  # noqa: E402
from cycler import cycler  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from farm.histogram import histogram_quantile  # noqa: E402
from farm.readers.rows import ResultRow, as_rows  # noqa: E402
from schemas.load import Histogram  # noqa: E402
from schemas.metrics import BY_NAME  # noqa: E402

#: the smallest text on a plot, pt (11.3 CSS px at 96 px per 72 pt)
SMALL_PT = 8.5
#: the widest figure, in: 1,200 CSS px
MAX_WIDTH_IN = 12.5
plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "farm", "font.size": 10, "axes.grid": True,
                     "grid.alpha": 0.3, "legend.fontsize": 9, "xtick.labelsize": 9, "ytick.labelsize": 9,
                     "axes.titlesize": 11, "figure.titlesize": 12, "figure.dpi": 96,
                     "axes.prop_cycle": cycler(color=[plt.get_cmap("tab20")(i) for i in range(20)])})
MIB = 2**20


def label(metric: str) -> str:
    """An axis label from the registry, e.g. ``p99 latency (ms)``; bytes are shown in MiB."""
    m = BY_NAME[metric]
    return f"{m.title} (MiB)" if m.unit == "B" else m.axis_label


def plain(v: float, _pos: object = None) -> str:
    """A tick label in plain numbers with thousands separators (``0.5``, ``20``, ``1,000``)."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"


def value(row: ResultRow, metric: str) -> float | None:
    """A metric of ``row`` as a plotted number (bytes in MiB); None when not measured."""
    v = row.get(metric)
    if v is None:
        return None
    return float(v) / MIB if BY_NAME[metric].unit == "B" else float(v)


def _log_if_wide(ax: Axes, values: Iterable[float], axis: str) -> None:
    """Log scale when the values span more than a decade, with major ticks at 1-2-5 steps (1, 2, 5 per
    decade up to three decades, then decades only) in plain numbers and unlabelled minor ticks: matplotlib's
    default labels minor ticks too (``3×10¹4×10¹``) and they collide."""
    vals = [v for v in values if v and v > 0]
    if not vals or max(vals) / min(vals) <= 10:
        _plain_axis(ax, axis)
        return
    decades = max(vals) / min(vals)
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 1000 else (1.0,)))
    target.set_major_formatter(FuncFormatter(plain))
    target.set_minor_formatter(NullFormatter())


def _plain_axis(ax: Axes, axis: str) -> None:
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(FuncFormatter(plain))


def to_svg(fig: Figure) -> str:
    """The figure as an ``<svg>`` element (XML header dropped), then closed."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg"):], flags=re.S)


def _serving(rows: list[ResultRow]) -> list[ResultRow]:
    return [r for r in as_rows(rows) if not r.is_edge and r.succeeded]


def _groups(rows: list[ResultRow], key: Callable[[ResultRow], tuple[Any, ...]]
            ) -> dict[tuple[Any, ...], list[ResultRow]]:
    out: dict[tuple[Any, ...], list[ResultRow]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: tuple(str(k) for k in kv[0])))


def throughput_vs_p99(rows: list[ResultRow]) -> str | None:
    """Model Analyzer's main chart: throughput against p99, one line per device x engine x batch size, its
    points the concurrency levels."""
    serving = [r for r in _serving(rows) if r.get("latency_p99_ms") and r.get("throughput_infer_per_s")]
    if not serving:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for (device, engine, b), group in _groups(serving, lambda r: (r["device"], r["engine"], r["batch_size"])).items():
        group.sort(key=lambda r: (r["concurrency"], r.get("rate") or 0))
        xs, ys = [r["latency_p99_ms"] for r in group], [r["throughput_infer_per_s"] for r in group]
        ax.plot(xs, ys, marker="o", label=f"{device} {engine} batch {b}")
        for r in group:
            point = f"{r['rate']:g}/s" if r.get("rate") else f"c{r['concurrency']}"
            ax.annotate(point, (r["latency_p99_ms"], r["throughput_infer_per_s"]), fontsize=SMALL_PT,
                        textcoords="offset points", xytext=(3, 3))
    _log_if_wide(ax, (r["latency_p99_ms"] for r in serving), "x")
    _log_if_wide(ax, (r["throughput_infer_per_s"] for r in serving), "y")
    ax.set(title="Throughput vs p99 latency (points: concurrency or open-loop rate)", xlabel=label("latency_p99_ms"),
           ylabel=label("throughput_infer_per_s"))
    fig.legend(loc="outside right center")
    return to_svg(fig)


def by_batch(rows: list[ResultRow], metrics: tuple[str, ...], title: str) -> str | None:
    """``metrics`` against batch size, one subplot each, one line per device x engine x concurrency; metrics
    no row measured are left out (e.g. GPU figures on a CPU-only request)."""
    serving = _serving(rows)
    present = [m for m in metrics if any(r.get(m) is not None for r in serving)]
    if not present:
        return None
    ncols = min(3, len(present))
    nrows = -(-len(present) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(min(MAX_WIDTH_IN, 4.1 * ncols), 3.4 * nrows + 0.8),
                             squeeze=False, layout="constrained")
    groups = _groups(serving, lambda r: (r["device"], r["engine"], r["concurrency"]))
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(present):]:
        ax.set_visible(False)
    for ax, m in zip(flat, present, strict=False):
        for (device, engine, c), group in groups.items():
            pts = sorted((r["batch_size"], value(r, m)) for r in group if r.get(m) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{device} {engine} c{c}")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        _log_if_wide(ax, (value(r, m) or 0 for r in serving), "y")
        ax.set(title=BY_NAME[m].title, xlabel="batch size (samples per request)", ylabel=label(m))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, max(1, len(labels))))
    fig.suptitle(title)
    return to_svg(fig)


def e2e_vs_compute(rows: list[ResultRow], limit: int = 40) -> str | None:
    """End-to-end p50 beside the server's compute p50 per configuration: the gap is harness and transport."""
    serving = [r for r in _serving(rows) if r.get("latency_p50_ms") is not None][:limit]
    if not serving:
        return None
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.3 * len(serving)), layout="constrained")
    names = [f"{r['device']} {r['engine']} b{r['batch_size']} c{r['concurrency']}" for r in serving]
    ys = list(range(len(serving)))
    ax.barh([y + 0.2 for y in ys], [r["latency_p50_ms"] for r in serving], height=0.4,
            label="end-to-end p50 (client, gRPC, server)")
    ax.barh([y - 0.2 for y in ys], [r.get("server_compute_p50_ms") or 0 for r in serving], height=0.4,
            label="server compute p50")
    for y, r in zip(ys, serving, strict=True):  # no bar is not a zero: say so (perf_analyzer gives averages only)
        if r.get("server_compute_p50_ms") is None:
            ax.annotate("compute p50 not measured", (0, y - 0.2), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=SMALL_PT, color="0.35")
    ax.set_yticks(ys, names, fontsize=SMALL_PT)
    ax.invert_yaxis()
    _plain_axis(ax, "x")  # linear: a bar's length is its value, so the gap reads as the harness's share
    ax.set(title="End-to-end vs server compute latency (the gap: harness and transport)", xlabel="p50 latency (ms)")
    fig.legend(loc="outside lower center", ncol=2)
    return to_svg(fig)


def edge_profiles(rows: list[ResultRow]) -> str | None:
    """Per edge profile and batch size: throughput, p99, CPU % (LLM runs: output tokens/s, TTFT and TPOT p90) and
    memory peak against the limit; OOM marked."""
    edge = [r for r in as_rows(rows) if r.is_edge]
    if not edge:
        return None
    names = [f"{r['edge_profile']} b{r['batch_size']}" + (" OOM" if r.get("oom_killed") else "") for r in edge]
    fig, axes = plt.subplots(1, 4, figsize=(MAX_WIDTH_IN, 2.0 + 0.4 * len(edge)), squeeze=False, layout="constrained")
    ys = list(range(len(edge)))
    colours = ["tab:red" if r.get("oom_killed") else "tab:blue" for r in edge]
    llm = any(r.get("output_tokens_per_s") is not None for r in edge)  # LLM servers under the limits
    shown = ("output_tokens_per_s", "ttft_p90_ms", "tpot_p90_ms") if llm else (
        "throughput_infer_per_s", "latency_p99_ms", "cpu_pct_avg")
    for ax, m in zip(axes[0][:3], shown, strict=True):
        ax.barh(ys, [value(r, m) or 0 for r in edge], color=colours)
        ax.set(title=BY_NAME[m].title, xlabel=label(m))
        _plain_axis(ax, "x")
        ax.set_yticks(ys, names if ax is axes[0][0] else [""] * len(ys), fontsize=SMALL_PT)
        ax.invert_yaxis()
    ax = axes[0][3]
    ax.barh([y + 0.2 for y in ys], [value(r, "mem_peak_bytes") or 0 for r in edge], height=0.4, color=colours,
            label="memory peak")
    ax.barh([y - 0.2 for y in ys], [value(r, "mem_limit_bytes") or 0 for r in edge], height=0.4, color="tab:gray",
            label="memory limit")
    ax.set(title="memory peak vs limit", xlabel="memory (MiB)")
    _plain_axis(ax, "x")
    ax.set_yticks(ys, [""] * len(ys))
    ax.invert_yaxis()
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower right", ncol=2)
    how = "LLM servers held to the limits, over HTTP" if llm else "in-process, no transport"
    fig.suptitle(f"Edge profiles ({how}; red: killed out of memory)")
    return to_svg(fig)


def latency_cdf(top: list[tuple[str, Histogram]]) -> str | None:
    """The end-to-end latency distribution (CDF) of the given configurations from their stored histograms;
    ``top``: (legend name, histogram) pairs."""
    curves = [(name, h) for name, h in top if h and h.get("count")]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.4), layout="constrained")
    every_x: list[float] = []
    for name, h in curves:
        n, cum, xs, ys = int(h["count"]), 0, [], []
        for upper, c in zip(h["bounds_ms"][1:], h["counts"], strict=False):
            cum += int(c)
            xs.append(min(upper, h.get("max_ms") or upper))
            ys.append(100.0 * cum / n)
        ax.step(xs, ys, where="post", label=f"{name} (p99 {histogram_quantile(h, 99):.3g} ms)")
        every_x += xs
    _log_if_wide(ax, every_x, "x")
    ax.set(title="Latency distribution of the top configurations (from stored histograms)",
           xlabel="end-to-end latency (ms)", ylabel="requests at or below (%)", ylim=(0, 100.5))
    fig.legend(loc="outside lower center", ncol=1)
    return to_svg(fig)

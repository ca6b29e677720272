"""The LLM reports' server-side sections: each job's TTFT split into the server's queue + prefill and the rest
(``farm.readers.ttft_split``), as ``farm report`` lines and as the HTML report's stacked bars, and what bounds each
sweep at its knee (``farm.readers.knee_cause``) as HTML."""
from __future__ import annotations

import html
from typing import Any

from farm.readers.knee import sweep_key, sweep_label
from farm.readers.knee_cause import KneeCause
from farm.readers.rows import ResultRow
from farm.readers.ttft_split import TtftSplit, ttft_split

#: the HTML bars' CSS (the page's style sheet adds it): queue red, prefill blue, the rest grey
CSS = (".tbar{width:18em;height:14px;background:#f4f4f4}.tbar div{display:flex;height:100%}"
       ".tbar span{display:block;height:100%}.tq{background:#d62728}.tp{background:#1f77b4}.tr{background:#aaa}"
       ".key{display:inline-block;width:1em;height:.8em;margin:0 .3em}")


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def load_text(row: ResultRow) -> str:
    """``c=4``, or ``2 req/s`` for an open-loop row."""
    return f"c={row.get('concurrency')}" if row.rate is None else f"{row.rate:g} req/s"


def splits(rows: list[ResultRow]) -> list[tuple[str, ResultRow, TtftSplit]]:
    """(sweep label, row, split) of each succeeded serving LLM row with a client TTFT, by sweep then load."""
    out = []
    for r in rows:
        split = ttft_split(r) if r.succeeded and not r.is_edge else None
        if split is not None:
            out.append((sweep_label(sweep_key(r)), r, split))
    return sorted(out, key=lambda t: (t[0], t[1].rate is not None, t[1].rate or 0.0, t[1].get("concurrency") or 0))


def split_lines(rows: list[ResultRow]) -> list[str]:
    """``farm report``'s lines: one per job with a split, one per sweep whose server gives no split."""
    out: list[str] = []
    said: set[str] = set()
    for sweep, r, split in splits(rows):
        if split.missing is None:
            out.append(f"TTFT split, {sweep} {load_text(r)}: {split.text()}")
        elif sweep not in said:
            said.add(sweep)
            out.append(f"TTFT split, {sweep}: no split: {split.missing}")
    return out


def split_json(rows: list[ResultRow]) -> list[dict[str, object]]:
    """The splits as ``farm report --json`` prints them."""
    return [{"job_id": r.job_id, "sweep": sweep, "concurrency": r.get("concurrency"), "rate": r.rate,
             **split.as_json()} for sweep, r, split in splits(rows)]


def _bar(split: TtftSplit, scale_ms: float) -> str:
    """A stacked bar of ``split``, as wide as its TTFT against ``scale_ms`` (the widest)."""
    parts = [("tq", "queue", split.queue_ms), ("tp", "prefill", split.prefill_ms), ("tr", "rest", split.rest_ms)]
    total = sum(v or 0.0 for _, _, v in parts) or 1.0
    spans = "".join(f'<span class="{cls}" data-part="{name}" style="width:{100.0 * v / total:.2f}%" '
                    f'title="{name} {v:,.1f} ms"></span>' for cls, name, v in parts if v)
    return f'<div class="tbar"><div style="width:{100.0 * split.ttft_ms / scale_ms:.2f}%">{spans}</div></div>'


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def split_section(rows: list[ResultRow]) -> str:
    """The HTML report's TTFT split: a table of the jobs, each with its stacked bar (all on one scale), or the
    reason its server gives no split."""
    found = splits(rows)
    if not found:
        return ""
    scale = max(s.ttft_ms for _, _, s in found) or 1.0
    out = ['<h3>TTFT split: the server\'s queue + prefill and the rest</h3><p>The client\'s TTFT p50 split into '
           'the server\'s own queue and prefill times (its <code>/metrics</code> and per-request timings) and the rest '
           '(network, HTTP and the client): <span class="key tq"></span>queue <span class="key tp"></span>prefill '
           '<span class="key tr"></span>rest; bars on one scale. See docs/reports.md for where each figure comes '
           'from.</p><table id="ttft-split"><tr><th class=l>job</th><th class=l>sweep</th><th class=l>load</th>'
           '<th>TTFT p50 ms</th><th>queue ms</th><th>prefill ms</th><th>rest ms</th><th class=l>split</th></tr>']
    for sweep, r, s in found:
        head = (f'<tr data-job="{_e(r.job_id)}"><td class=l><code>{_e(r.job_id[:6])}</code></td>'
                f"<td class=l>{_e(sweep)}</td><td class=l>{_e(load_text(r))}</td><td>{_ms(s.ttft_ms)}</td>")
        if s.missing:
            out.append(f'{head}<td class="l w nosplit" colspan=4>no split: {_e(s.missing)}</td></tr>')
            continue
        note = f' title="{_e(s.note)}"' if s.note else ""
        out.append(f"{head}<td title=\"{_e(s.queue_from)}\">{_ms(s.queue_ms)}</td><td title=\"{_e(s.prefill_from)}\">"
                   f"{_ms(s.prefill_ms)}</td><td{note}>{_ms(s.rest_ms)}</td><td class=l>{_bar(s, scale)}</td></tr>")
    return "\n".join(out) + "</table>"


def knee_section(causes: list[KneeCause]) -> str:
    """The HTML report's knees with what bounds each sweep there (or which cause cannot be judged)."""
    if not causes:
        return ""
    return ('<h3>Knees of the sweeps and what bounds them</h3><ul id="knees">'
            + "".join(f'<li data-sweep="{_e(c.sweep)}" data-bound-by="{_e(" ".join(k for k, _ in c.causes))}">'
                      f"{_e(c.text())}</li>" for c in causes) + "</ul>")

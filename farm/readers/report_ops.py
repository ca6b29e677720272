"""The op-profile part of ``farm report -o`` (HTML): per job, a stacked bar of its compute time by op type (top
types, the rest as "other", and the overhead), across batch sizes and engines; then each job's top-N nodes.
Plain HTML and CSS (no script, no plot library), so it opens offline under the report's CSP."""
from __future__ import annotations

import hashlib
from html import escape

from farm.op_profile import Stored, by_op_type, job_label
from schemas.op_profile import OVERHEAD

#: op types shown by name in the bars (the rest are "other")
BAR_TYPES = 6
OTHER = "other"


def _colour(op_type: str) -> str:
    if op_type == OVERHEAD:
        return "#bbbbbb"
    if op_type == OTHER:
        return "#dddddd"
    hue = int(hashlib.sha256(op_type.encode()).hexdigest()[:4], 16) % 360
    return f"hsl({hue},55%,55%)"


def _segments(stored: Stored) -> list[tuple[str, float]]:
    """(op type, share of the compute time) per bar segment; overhead last, negative overhead shown as none."""
    prof = stored.profile
    whole = max(prof.compute_ms or 0.0, prof.node_sum_ms or 0.0)
    if whole <= 0:
        return []
    rows = [r for r in by_op_type(prof) if r["op_type"] != OVERHEAD]
    segs = [(r["op_type"], r["self_ms"] / whole) for r in rows[:BAR_TYPES]]
    rest = sum(r["self_ms"] for r in rows[BAR_TYPES:]) / whole
    if rest > 0:
        segs.append((OTHER, rest))
    if (prof.overhead_ms or 0) > 0:
        segs.append((OVERHEAD, (prof.overhead_ms or 0.0) / whole))
    return segs


def section(profiles: list[Stored], top: int = 10) -> str:
    """The HTML section (empty when the request has no op profile)."""
    if not profiles:
        return ""
    out = ["<h2>Where the time goes (op profiles)</h2>",
           "<p>share of each job's engine compute time per inference, by op type; overhead: compute time no "
           "node accounts for (never spread over nodes). <code>farm ops JOB</code> prints every node.</p>",
           '<table id="op-types">']
    for s in profiles:
        label = escape(f"{s.job_id[:8]} {job_label(s)}")
        if s.profile.status != "ok":
            out.append(f"<tr><td>{label}</td><td>no op profile: {escape(str(s.profile.reason))}</td></tr>")
            continue
        bar = "".join(f'<span title="{escape(t)} {100 * v:.1f}%" style="display:inline-block;height:1.2em;'
                      f'width:{100 * v:.2f}%;background:{_colour(t)}"></span>' for t, v in _segments(s))
        legend = ", ".join(f"{escape(t)} {100 * v:.0f}%" for t, v in _segments(s)[:4])
        out.append(f'<tr><td>{label}</td><td style="width:60%"><div style="width:100%;white-space:nowrap">{bar}'
                   f"</div><small>{legend}; compute {s.profile.compute_ms or 0:.3f} ms</small></td></tr>")
    out.append("</table>")
    for s in profiles:
        if s.profile.status != "ok":
            continue
        out.append(f"<h3>top {min(top, len(s.profile.nodes))} nodes: {escape(s.job_id[:8])} "
                   f"{escape(job_label(s))}</h3><table class=\"op-nodes\"><tr><th>node</th><th>op type</th>"
                   "<th>ms p50</th><th>ms p90</th><th>share</th><th>fused</th></tr>")
        for n in s.profile.nodes[:top]:
            out.append(f"<tr><td>{escape(n.name)}</td><td>{escape(n.op_type)}</td><td>{n.self_ms_p50:.3f}</td>"
                       f"<td>{n.self_ms_p90:.3f}</td><td>{100 * n.share:.1f}%</td>"
                       f"<td>{escape(', '.join(n.fused))}</td></tr>")
        out.append("</table>")
    return "\n".join(out)

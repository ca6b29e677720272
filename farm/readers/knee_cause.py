"""What bounds each LLM sweep at its knee (``farm.readers.knee``), said with the figures.

The step judged is the one that ended the climb: from the knee to the next point of the sweep (concurrency, or
the offered rate of an open-loop sweep). Each cause is judged on the rows' typed columns (the server's own view:
``workers.loadgen.openai.server_scrape``; the client's own cost) at those two points, the repeats at one load
averaged:

- **slots**: the queue grows at constant running requests: the server's requests running (most seen) stays the
  same and at its max (the slots the job's knobs name: llama-server's ``n_parallel``, vLLM's ``max_num_seqs``; where
  they name none, the mean at least :data:`AT_MAX` of the most seen) while its requests waiting (mean) rises by
  at least :data:`QUEUE_RISE`;
- **memory**: the KV cache is full (its use at least :data:`KV_FULL_PCT` %) or the server preempted requests;
- **compute**: the server's prefill time p50 (``farm.readers.ttft_split.server_prefill_ms``) rises by at least
  :data:`PREFILL_RISE_PCT` % while more requests run at once (the most seen rose: they share the compute; a
  prefill that rises at constant running requests is not theirs); without the server's running figures, on the
  prefill time alone;
- **client**: the load client's own process was at least :data:`CLIENT_BOUND_PCT` % busy, or more than
  ``schemas.result.CLIENT_LIMITED_PCT`` % of its open-loop sends left late.

Every cause that holds is named. A cause whose figures the rows lack is named as one that cannot be judged (a
server without ``/metrics``: slots and memory; no prefill time: compute; no client CPU: client). A sweep still
climbing at its end has no bound yet.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from farm.readers.knee import KNEE_GAIN_PCT, SWEEP_LOADS, Knee, knee_of, sweep_label, sweep_load, sweeps
from farm.readers.rows import ResultRow
from farm.readers.ttft_split import server_prefill_ms, server_queue_ms
from schemas.result import CLIENT_LIMITED_PCT

#: the rise in the server's mean requests waiting, knee to next point, that counts as a growing queue (requests)
QUEUE_RISE = 0.2
#: the share of its most running requests the server's mean must reach to count as running at its max
AT_MAX = 0.9
#: the KV-cache use that counts as full, %
KV_FULL_PCT = 95.0
#: the rise in the server's prefill p50, knee to next point, that counts as compute-bound, %
PREFILL_RISE_PCT = 50.0
#: the load client's own CPU busy share that counts as client-bound, %
CLIENT_BOUND_PCT = 90.0
#: the causes, in the order they are named
CAUSES = {"slots": "the queue grows at constant running requests (slots / max_num_seqs)",
          "memory": "the KV cache is full or preempting (memory)",
          "compute": "prefill time rises (compute)",
          "client": "the client (its own measured cost)"}
FIGURES = ("server_requests_running_max", "server_requests_running_mean", "server_requests_waiting_mean",
           "server_kv_cache_usage_max_pct", "server_preemptions", "server_scrapes", "client_busy_pct", "late_send_pct",
           "prefill_ms", "slots")
#: the knobs that name a server's slots (the most requests it runs at once)
SLOT_KNOBS = ("n_parallel", "max_num_seqs")


@dataclass(frozen=True)
class Point:
    """One load of a sweep: the load and the figures judged there (repeats averaged; None: not measured)."""

    load: float
    figures: dict[str, float | None]

    def get(self, name: str) -> float | None:
        return self.figures.get(name)


@dataclass
class KneeCause:
    """What bounds one sweep at its ``knee``: ``causes`` (cause, sentence with figures) that hold and
    ``unjudged`` (cause, why it cannot be judged); ``cleared``: (cause, its figures) judged and found not to
    hold."""

    sweep: str
    knee: Knee
    causes: list[tuple[str, str]] = field(default_factory=list)
    unjudged: list[tuple[str, str]] = field(default_factory=list)
    cleared: list[tuple[str, str]] = field(default_factory=list)

    def text(self) -> str:
        """``cpu llama.cpp n_parallel=1: knee at c=1: 90 tok/s; bounded by: the queue grows ... (figures)``."""
        head = f"{self.sweep}{' (rate sweep)' if self.knee.by == 'rate' else ''}: {self.knee.text()}"
        if not self.knee.saturated:
            return f"{head}; nothing bounds it yet"
        found = ("bounded by: " + "; ".join(f"{CAUSES[c]}: {why}" for c, why in self.causes) if self.causes
                 else "no cause found among those judged: " + "; ".join(f"{c}: {why}" for c, why in self.cleared))
        unjudged = "".join(f"; {CAUSES[c]} cannot be judged: {why}" for c, why in self.unjudged)
        return f"{head}; {found}{unjudged}"

    def as_json(self) -> dict[str, object]:
        """As ``farm report --json`` prints it."""
        return {**self.knee.as_json(self.sweep), "by": self.knee.by,
                "bound_by": [{"cause": c, "why": w} for c, w in self.causes],
                "cannot_judge": [{"cause": c, "why": w} for c, w in self.unjudged],
                "cleared": [{"cause": c, "figures": w} for c, w in self.cleared]}


def _point(load: float, rows: list[ResultRow]) -> Point:
    """The figures of the rows at ``load`` (each averaged over the rows that have it)."""
    figures: dict[str, float | None] = {}
    for name in FIGURES:
        values = [v for v in (_figure(r, name) for r in rows) if v is not None]
        figures[name] = sum(values) / len(values) if values else None
    return Point(load, figures)


def _figure(row: ResultRow, name: str) -> float | None:
    if name == "prefill_ms":
        return server_prefill_ms(row, server_queue_ms(row)[0])[0]
    if name == "slots":
        stored = row.get("knobs")
        knobs: dict[str, object] = stored if isinstance(stored, dict) else {}
        slots = [v for k in SLOT_KNOBS if isinstance(v := knobs.get(k), int | float) and not isinstance(v, bool)]
        return float(slots[0]) if slots else None
    v = row.get(name)
    return None if v is None or isinstance(v, bool) else float(v)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}".rstrip("0").removesuffix(".")


def _slots(k: Point, n: Point, step: str) -> tuple[bool, str] | None:
    run_k, run_n = k.get("server_requests_running_max"), n.get("server_requests_running_max")
    wait_k, wait_n = k.get("server_requests_waiting_mean"), n.get("server_requests_waiting_mean")
    mean_k, mean_n = k.get("server_requests_running_mean"), n.get("server_requests_running_mean")
    if run_k is None or run_n is None or wait_k is None or wait_n is None or mean_n is None:
        return None
    slots = n.get("slots")
    at_max = run_n >= slots - 0.5 if slots is not None else mean_n >= AT_MAX * run_n
    held = abs(run_n - run_k) < 0.5 and at_max and wait_n - wait_k >= QUEUE_RISE
    of = f" of {_fmt(slots)} slots" if slots is not None else ""
    return held, (f"requests running (mean/max) {_fmt(mean_k)}/{_fmt(run_k)} → {_fmt(mean_n)}/{_fmt(run_n)}{of}, "
                  f"waiting (mean) {_fmt(wait_k)} → {_fmt(wait_n)} ({step})")


def _memory(k: Point, n: Point, step: str) -> tuple[bool, str] | None:
    kv = [v for v in (k.get("server_kv_cache_usage_max_pct"), n.get("server_kv_cache_usage_max_pct")) if v is not None]
    pre = [v for v in (k.get("server_preemptions"), n.get("server_preemptions")) if v is not None]
    if not kv and not pre:
        return None
    held = max(kv, default=0.0) >= KV_FULL_PCT or max(pre, default=0.0) > 0
    figures = ([f"KV cache used (max) {_fmt(k.get('server_kv_cache_usage_max_pct'))} → "
                f"{_fmt(n.get('server_kv_cache_usage_max_pct'))} %"] if kv else []) + (
        [f"preemptions {_fmt(k.get('server_preemptions'))} → {_fmt(n.get('server_preemptions'))}"] if pre else [])
    return held, f"{', '.join(figures)} ({step})"


def _compute(k: Point, n: Point, step: str) -> tuple[bool, str] | None:
    pk, pn = k.get("prefill_ms"), n.get("prefill_ms")
    if pk is None or pn is None:
        return None
    run_k, run_n = k.get("server_requests_running_max"), n.get("server_requests_running_max")
    more = run_k is None or run_n is None or run_n > run_k
    held = more and pk > 0 and 100.0 * (pn / pk - 1.0) >= PREFILL_RISE_PCT
    running = "" if run_k is None or run_n is None else f", requests running (max) {_fmt(run_k)} → {_fmt(run_n)}"
    return held, f"server prefill p50 {_fmt(pk)} → {_fmt(pn)} ms{running} ({step})"


def _client(k: Point, n: Point, step: str) -> tuple[bool, str] | None:
    busy = [v for v in (k.get("client_busy_pct"), n.get("client_busy_pct")) if v is not None]
    late = [v for v in (k.get("late_send_pct"), n.get("late_send_pct")) if v is not None]
    if not busy and not late:
        return None
    held = max(busy, default=0.0) >= CLIENT_BOUND_PCT or max(late, default=0.0) > CLIENT_LIMITED_PCT
    figures = ([f"its process {_fmt(k.get('client_busy_pct'))} → {_fmt(n.get('client_busy_pct'))} % busy"]
               if busy else []) + ([f"late sends {_fmt(k.get('late_send_pct'))} → {_fmt(n.get('late_send_pct'))} %"]
                                   if late else [])
    return held, f"{', '.join(figures)} ({step})"


def _why_unjudged(cause: str, k: Point, n: Point) -> str:
    """Why ``cause`` cannot be judged at the step from ``k`` to ``n``."""
    if cause in ("slots", "memory") and not min(k.get("server_scrapes") or 0, n.get("server_scrapes") or 0):
        return "the server's own view is missing (no /metrics scraped)"
    return {"slots": "the server reports no requests running and waiting",
            "memory": "the server reports no KV-cache use and no preemptions",
            "compute": "the server reports no prefill time",
            "client": "the client's own CPU and late sends were not measured"}[cause]


JUDGES = {"slots": _slots, "memory": _memory, "compute": _compute, "client": _client}


def explain(sweep: str, knee: Knee, rows: list[ResultRow]) -> KneeCause:
    """What bounds the sweep ``sweep`` of ``rows`` at its ``knee``: the step from the knee to the next load."""
    out = KneeCause(sweep, knee)
    loads = sorted({float(load) for r in rows if (load := sweep_load(r, knee.by)) is not None})
    after = [x for x in loads if x > knee.concurrency]
    if not knee.saturated or not after:
        return out
    k, n = (_point(x, [r for r in rows if sweep_load(r, knee.by) == x]) for x in (knee.concurrency, after[0]))
    step = f"{knee.at(k.load)} → {knee.at(n.load)}"
    for cause, judge in JUDGES.items():
        verdict = judge(k, n, step)
        if verdict is None:
            out.unjudged.append((cause, _why_unjudged(cause, k, n)))
        else:
            (out.causes if verdict[0] else out.cleared).append((cause, verdict[1]))
    return out


def knee_causes(rows: Iterable[ResultRow], min_gain_pct: float = KNEE_GAIN_PCT) -> list[KneeCause]:
    """What bounds each concurrency sweep, then each rate sweep, among ``rows`` at its knee, in label order."""
    out = []
    rows = list(rows)
    for by in SWEEP_LOADS:
        found = []
        for key, swept in sweeps(rows, by).items():
            knee = knee_of(swept, by, min_gain_pct)
            if knee is not None:
                found.append(explain(sweep_label(key), knee, swept))
        out += sorted(found, key=lambda c: c.sweep)
    return out

"""The figures of a sessions workload per turn index (``--sessions``): over every session's k-th turn measured, its
TTFT (p50, p99, ms), the prompt tokens the server counted (its history included, mean) and the share of them it
served from its prefix cache (``usage.prompt_tokens_details.cached_tokens`` or llama.cpp's ``timings.cache_n``; None
where the server says neither). The first ``schemas.metrics.TURN_METRICS`` turns are metrics of their own
(``turn{k}_ttft_p50_ms``, ``turn{k}_cached_prompt_tokens_pct``: result columns); every turn's figures are in the
job's details (``session_turns``)."""
from __future__ import annotations

from dataclasses import dataclass

from schemas.metrics import TURN_METRICS, MetricValues
from workers.loadgen import stats
from workers.loadgen.openai.fidelity import cached_pct
from workers.loadgen.openai.stream import Outcome


@dataclass(frozen=True)
class TurnFigures:
    """Turn ``turn``'s figures over the sessions (see the module docstring): ``requests`` measured."""

    turn: int
    requests: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    prompt_tokens_mean: float | None
    cached_prompt_tokens_pct: float | None


def turn_figures(outcomes: list[Outcome]) -> list[TurnFigures]:
    """The figures of each turn index the measured requests hold, in turn order (none: not a sessions run)."""
    by_turn: dict[int, list[Outcome]] = {}
    for o in outcomes:
        if o.turn:
            by_turn.setdefault(o.turn, []).append(o)
    out = []
    for turn, outs in sorted(by_turn.items()):
        p50, p99 = stats.percentiles([o.ttft_ms for o in outs], (50, 99))
        out.append(TurnFigures(turn=turn, requests=len(outs), ttft_p50_ms=p50, ttft_p99_ms=p99,
                               prompt_tokens_mean=stats.mean([o.input_tokens for o in outs]),
                               cached_prompt_tokens_pct=cached_pct(outs)))
    return out


def turn_metrics(figures: list[TurnFigures]) -> MetricValues:
    """The per-turn metrics of the first ``TURN_METRICS`` turns (registry names)."""
    out: MetricValues = {}
    for f in figures:
        if f.turn <= TURN_METRICS:
            out[f"turn{f.turn}_ttft_p50_ms"] = f.ttft_p50_ms
            out[f"turn{f.turn}_cached_prompt_tokens_pct"] = f.cached_prompt_tokens_pct
    return out

"""Whether the workload the server saw is the one asked: the prompt and output lengths the server itself counted
(its ``usage``) against those the workload meant, and the share of prompt tokens it served from its prefix cache.

Prompts cut by the server's own tokenizer (``server_tokenizer``) are its count where it reports no usage
(llama-cpp-python streams none).

A row gets typed metrics (``requested_*_tokens_mean``, ``*_tokens_off_pct``, ``cached_prompt_tokens_pct``,
``workload_as_asked``) and, for each length off by more than :data:`TOLERANCE_PCT`, a note saying by how much and
why it may be so. Prompts counted by words (no tokenizer of the server's) with no server count to check them against
are said to be approximate.
"""
from __future__ import annotations

from workers.loadgen import stats
from workers.loadgen.openai.stream import Outcome

Metrics = dict[str, float | int | bool | None]
#: the most a mean length may differ from the asked one, %, before the row is flagged
TOLERANCE_PCT = 2.0
#: how many points the prefix-cache share may pass the share the shared prefix explains before a note says so
CACHE_SLACK_PCT = 10.0


def _off_pct(got: list[int], asked: list[int]) -> float | None:
    """The mean of ``got`` against the mean of ``asked``, signed % (None: nothing to compare)."""
    if not got or not sum(asked):
        return None
    return (sum(got) / sum(asked) - 1.0) * 100.0  # the same requests on both sides: a ratio of means


def _pairs(outcomes: list[Outcome], sources: tuple[str, ...], output: bool) -> tuple[list[int], list[int]]:
    """(server-counted, asked) lengths of the requests whose count came from one of ``sources``."""
    if output:
        picked = [o for o in outcomes if o.output_source in sources and o.output_requested is not None]
        return [o.output_tokens for o in picked], [int(o.output_requested or 0) for o in picked]
    picked = [o for o in outcomes if o.input_source in sources and o.input_requested is not None]
    return [o.input_tokens for o in picked], [int(o.input_requested or 0) for o in picked]


def cached_pct(outcomes: list[Outcome]) -> float | None:
    """The share of ``outcomes``' prompt tokens the server said it served from its prefix cache, % (None: it said
    nothing)."""
    said = [o for o in outcomes if o.cached_tokens is not None]
    prompt = sum(o.input_tokens for o in said)
    return 100.0 * sum(int(o.cached_tokens or 0) for o in said) / prompt if said and prompt else None


def workload_metrics(outcomes: list[Outcome]) -> Metrics:
    """The typed checks of the measured requests (see the module docstring)."""
    in_got, in_asked = _pairs(outcomes, ("usage", "server"), output=False)  # server: cut by its /tokenize
    out_got, out_asked = _pairs(outcomes, ("usage", "tokenizer"), output=True)
    in_off, out_off = _off_pct(in_got, in_asked), _off_pct(out_got, out_asked)
    judged = [abs(v) <= TOLERANCE_PCT for v in (in_off, out_off) if v is not None]
    words = any(o.input_source == "words" for o in outcomes)
    return {
        "requested_input_tokens_mean": stats.mean([o.input_requested for o in outcomes
                                                   if o.input_requested is not None]),
        "requested_output_tokens_mean": stats.mean([o.output_requested for o in outcomes
                                                    if o.output_requested is not None]),
        "input_tokens_off_pct": in_off,
        "output_tokens_off_pct": out_off,
        "cached_prompt_tokens_pct": cached_pct(outcomes),
        # not as asked when a length is off, or prompts were counted by words with nothing to check them against
        "workload_as_asked": (all(judged) and not (words and in_off is None)) if judged or words else None,
    }


def workload_notes(m: Metrics, api: str, prefix_tokens: int, ignore_eos: bool, sessions: bool = False) -> list[str]:
    """The notes of a row whose workload was not the one asked (``m``: :func:`workload_metrics`); ``sessions``: a
    sessions workload, whose turns share their history by design (no note on its prefix-cache share)."""
    notes = []
    asked_in, asked_out = m["requested_input_tokens_mean"], m["requested_output_tokens_mean"]
    in_off, out_off = m["input_tokens_off_pct"], m["output_tokens_off_pct"]
    if isinstance(in_off, float) and abs(in_off) > TOLERANCE_PCT and isinstance(asked_in, float):
        why = ("; the chat template adds its own tokens" if api == "openai-chat" else "") + (
            "; give the server's tokenizer (--tokenizer) or serve with a /tokenize route")
        notes.append(f"prompts not as asked: {asked_in * (1 + in_off / 100):.1f} tokens per request by the server's "
                     f"count (usage), {asked_in:.1f} asked ({in_off:+.1f} %){why} (input_tokens_off_pct)")
    elif in_off is None and m["workload_as_asked"] is False:
        notes.append("prompts approximate: a word stood for a token and the server reported no usage to check them "
                     "by; give the server's tokenizer (--tokenizer)")
    if isinstance(out_off, float) and abs(out_off) > TOLERANCE_PCT and isinstance(asked_out, float):
        why = ("the server stopped early (end of sequence) though asked to ignore it" if ignore_eos else
               "the server takes no ignore_eos, so it stops at its end of sequence")
        notes.append(f"outputs not as asked: {asked_out * (1 + out_off / 100):.1f} tokens per request, "
                     f"{asked_out:.1f} asked ({out_off:+.1f} %): {why} (output_tokens_off_pct)")
    cached = m["cached_prompt_tokens_pct"]
    shared = 100.0 * prefix_tokens / asked_in if isinstance(asked_in, float) and asked_in else 0.0
    if isinstance(cached, float) and cached > shared + CACHE_SLACK_PCT and not sessions:
        notes.append(f"the server served {cached:.0f} % of the prompt tokens from its prefix cache, where the "
                     f"workload shares {shared:.0f} % (cached_prompt_tokens_pct)")
    return notes

"""farm's OpenAI streaming client: drives an LLM server's ``/v1/chat/completions`` or ``/v1/completions``
(``schemas.llm.LlmSettings``) through the job's load pattern and window plan, and turns each streamed answer
into TTFT, per-token ITL, TPOT and e2e latency with token counts whose source is recorded (``llm_stream``).

The load runs in its own process (``openai_http``); this side checks the server, builds the workload, cuts
the requests into the plan's windows by their end time (warm-up left out) and computes the LLM metrics that
``result.to_result`` adds to every client's (the e2e latencies are the result's ``latency_*``).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from farm.errors import FarmError, LoadGenError
from farm.llm_events import EventLog, ToolFigure
from farm.secrets import credential_value
from farm.settings import get_settings
from schemas.llm import LlmSettings, Slo, file_label
from schemas.measured import LLM_RPC
from schemas.metrics import MetricValues
from workers.loadgen import stats
from workers.loadgen.contract import ClientDetails, LoadClient, LoadJob, LoadRecord, RunTotals, WindowFigures
from workers.loadgen.openai import prefix_cache
from workers.loadgen.openai.event_log import recorded
from workers.loadgen.openai.fidelity import workload_metrics, workload_notes
from workers.loadgen.openai.jailed_workload import open_workload
from workers.loadgen.openai.load_loop import HttpJob, HttpRun, load_process
from workers.loadgen.openai.models_api import Auth, check_model
from workers.loadgen.openai.prefix_cache import CachePrep
from workers.loadgen.openai.request import PROBE_TEXT, probe
from workers.loadgen.openai.saturation import OverSaturation
from workers.loadgen.openai.server_metrics import scrape, server_quantiles
from workers.loadgen.openai.server_scrape import NO_METRICS_NOTE, Scrapes, scraping, summarise
from workers.loadgen.openai.server_tokenizer import server_tokenizer
from workers.loadgen.openai.stream import Outcome, RawRequest, account, chunk_tokens, kinds
from workers.loadgen.openai.trace_prompts import replay_pattern
from workers.loadgen.openai.turns import TurnFigures, turn_figures, turn_metrics
from workers.loadgen.openai.workload import WORDS, Prompt, Salts
from workers.loadgen.patterns import LoadPattern
from workers.loadgen.plan import WindowPlan
from workers.loadgen.result import judge_stable
from workers.loadgen.stops import Duration, RequestCount, StopRule

WAIT_MARGIN_S = 30.0  # how long past its plan the load process may take to stop and report


def _pcts(name: str, values: list[float] | np.ndarray) -> MetricValues:
    p50, p90, p99 = stats.percentiles(values, (50, 90, 99))
    return {f"{name}_p50_ms": p50, f"{name}_p90_ms": p90, f"{name}_p99_ms": p99}


def llm_metrics(outcomes: list[Outcome], duration_s: float, slo: Slo | None,
                output_tokens: float | None = None, reasoning_tokens: float | None = None) -> MetricValues:
    """The LLM metrics of the measured requests' outcomes over ``duration_s`` (s); ``output_tokens``,
    ``reasoning_tokens``: the tokens (all generated; reasoning ones) that arrived within that span (:func:`tokens_in`;
    None: the outcomes' own counts)."""
    d = max(duration_s, 1e-9)
    thought = sum(o.reasoning_tokens for o in outcomes) if reasoning_tokens is None else reasoning_tokens
    out_tok = [o.output_tokens for o in outcomes]
    in_tok = [o.input_tokens for o in outcomes]
    tpot = [o.tpot_ms for o in outcomes if o.tpot_ms is not None]
    server_ttft = [o.server_ttft_ms for o in outcomes if o.server_ttft_ms is not None]
    server_tpot = [o.server_tpot_ms for o in outcomes if o.server_tpot_ms is not None]
    good = sum(slo.met(o.ttft_ms, o.tpot_ms, o.e2e_ms) for o in outcomes) if slo is not None else None
    return {
        **_pcts("ttft", [o.ttft_ms for o in outcomes]),
        **_pcts("itl", np.concatenate([np.asarray(o.itl_ms) for o in outcomes]) if outcomes else []),
        **_pcts("tpot", tpot),
        **_pcts("ttfot", [o.ttfot_ms for o in outcomes if o.ttfot_ms is not None]),
        "output_tokens_per_s": (sum(out_tok) if output_tokens is None else output_tokens) / d,
        "reasoning_tokens_per_s": thought / d,
        "answer_tokens_per_s": ((sum(out_tok) if output_tokens is None else output_tokens) - thought) / d,
        "mean_reasoning_tokens": stats.mean([o.reasoning_tokens for o in outcomes]),
        # per user: what one stream sees while generating, the median request's tokens/s after its first token
        "output_tokens_per_s_per_user": stats.percentile([1e3 / t for t in tpot if t > 0], 50),
        "input_tokens_per_s": sum(in_tok) / d,
        "mean_input_tokens": stats.mean(in_tok),
        "mean_output_tokens": stats.mean(out_tok),
        "goodput_req_per_s": None if good is None else good / d,
        "output_overrun_count": sum(o.overrun for o in outcomes),
        "server_ttft_p50_ms": stats.percentile(server_ttft, 50) if server_ttft else None,
        "server_tpot_p50_ms": stats.percentile(server_tpot, 50) if server_tpot else None,
    }


def _missed(slo: Slo, age_ms: float, first_ms: float | None) -> bool:
    """Whether a request still in flight at the end (``age_ms`` old, its first chunk after ``first_ms``; None:
    none yet) has already missed the SLO; one that may still meet it is left out of the share."""
    ttft = first_ms if first_ms is not None else age_ms if slo.ttft_ms is not None and age_ms > slo.ttft_ms else None
    return ((slo.ttft_ms is not None and ttft is not None and ttft > slo.ttft_ms)
            or (slo.e2e_ms is not None and age_ms > slo.e2e_ms))


def slo_share(outcomes: list[Outcome], errors: int, unfinished: list[tuple[float, float | None]],
              slo: Slo | None) -> float | None:
    """The share (0..1) of the measured requests that met the SLO: a failed request, and one still in flight at
    the end that has already missed it (``_missed``), count against it (None: no SLO or no request)."""
    if slo is None:
        return None
    missed = sum(_missed(slo, age, first) for age, first in unfinished)
    total = len(outcomes) + errors + missed
    good = sum(slo.met(o.ttft_ms, o.tpot_ms, o.e2e_ms) for o in outcomes)
    return good / total if total else None


@dataclass(frozen=True)
class OpenAIDetails(ClientDetails):
    """The OpenAI client's own details: the API, URL and model; where token counts came from (request counts by
    source), tokens per chunk (mean, max: the server's chunking), requests over their output limit, the SLO,
    the workload, the first error, warm-up errors, requests cut off in flight at the end and the event loop;
    the share of measured requests within the SLO (``slo_share``) and, where the run was stopped early because
    the server fell behind its arrivals (``saturation``), why."""

    api: str
    base_url: str
    model: str
    token_sources: dict[str, dict[str, int]]
    tokens_per_chunk_mean: float | None
    tokens_per_chunk_max: float | None
    output_overruns: int
    slo: dict[str, Any] | None
    workload: dict[str, Any]
    first_error: str | None
    warmup_errors: int
    in_flight_at_end: int
    event_loop: str
    server_metrics: dict[str, float]  # the p50s (ms) read from the server's Prometheus /metrics, by figure
    send_lag_ms: dict[str, float | None]  # p50/p99 from the scheduled send to the request's write (the client's)
    loop_lag_ms: dict[str, float | None]  # p50/p99 lateness of the load loop's own timer: its (or the host's) delay
    slo_met_share: float | None  # measured requests within the SLO (0..1; None: no SLO)
    server_view: dict[str, Any]  # the server's /metrics through the windows (``server_scrape.summarise``)
    oversaturated: bool  # the run was stopped early: the server fell behind (``oversaturated_why``)
    oversaturated_why: str | None
    session_turns: list[TurnFigures]  # sessions: the figures of each turn index (``turns``; empty: not sessions)
    event_log: EventLog | None = None  # one event log per request (``farm.llm_events``; ``farm events JOB``)
    tool_figures: list[ToolFigure] = field(default_factory=list)  # TTFT/ITL/TPOT by farm's, vLLM's, AIPerf's, ...


def _windows(run: HttpRun, plan: WindowPlan, requests_mode: bool) -> list[tuple[float, float]]:
    """The measurement windows (monotonic s, start and end): the plan's after its warm-up, or in request-count
    mode one window from the warm-up's end to the last measured request's end."""
    t0 = run.t_start + plan.warmup_s
    if requests_mode:
        ends = [r.end for r in run.records if not r.warm]
        return [(t0, max([*ends, t0 + 1e-3]))]
    edges = [run.t_start + e for e in plan.edges_s()]
    windows = list(zip(edges[:-1], edges[1:], strict=True))
    stop = run.stopped_at
    if stop is None:
        return windows
    return [(a, min(b, stop)) for a, b in windows if a < stop] or windows[:1]  # an early stop ends the last one


def _window_of(t: float, windows: list[tuple[float, float]]) -> int | None:
    for k, (a, b) in enumerate(windows):
        if a <= t <= b:
            return k
    return None


@dataclass
class _Cut:
    """The measured requests by window: outcomes and error counts; the warm-up's successes and errors."""

    outcomes: list[list[Outcome]]
    errors: list[Counter[str]]
    warm_ok: int = 0
    warm_errors: int = 0


def _cut(run: HttpRun, windows: list[tuple[float, float]], count: Callable[[str], int] | None) -> _Cut:
    cut = _Cut([[] for _ in windows], [Counter() for _ in windows])
    for rec in run.records:
        if rec.warm:
            cut.warm_ok += rec.error is None
            cut.warm_errors += rec.error is not None
            continue
        k = _window_of(rec.end, windows)
        if k is None:
            continue
        if rec.error is None:
            cut.outcomes[k].append(account(rec, count))
        else:
            cut.errors[k][rec.error] += 1
    return cut


def tokens_in(run: HttpRun, windows: list[tuple[float, float]], count: Callable[[str], int] | None,
              outcomes: list[Outcome], only: str | None = None) -> float:
    """The output tokens that arrived within ``windows``, by the arrival time of their chunks: those of every
    complete request (warm-up ones too) and of those cut off in flight at the stop, whatever the request's
    start or end. A cut-off request has no final usage: its chunks are counted by the tokenizer, else at the
    complete requests' mean tokens per chunk (``outcomes``). ``only``: the chunks of that kind only (``reasoning``)."""
    chunks = sum(o.chunks for o in outcomes)
    per_chunk = sum(o.output_tokens for o in outcomes) / chunks if chunks else 1.0
    lo, hi = windows[0][0], windows[-1][1]  # the windows are contiguous
    total = 0.0
    for rec in (*(r for r in run.records if r.error is None), *run.cut):
        if not rec.chunk_t or rec.chunk_t[-1] < lo or rec.chunk_t[0] > hi:
            continue
        counts, _, source = chunk_tokens(rec, count)
        cut = rec.error is not None
        total += sum(per_chunk if cut and source == "chunks" else k
                     for t, k, kind in zip(rec.chunk_t, counts, kinds(rec), strict=True)
                     if lo <= t <= hi and only in (None, kind))
    return total


def _first_error(records: list[RawRequest]) -> str | None:
    return next((r.error_text for r in records if r.error is not None), None)


def _p50_p99(values: list[float]) -> dict[str, float | None]:
    return dict(zip(("p50", "p99"), stats.percentiles(values, (50, 99)), strict=True))


def _sources(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    return {"input": dict(Counter(o.input_source for o in outcomes)),
            "output": dict(Counter(o.output_source for o in outcomes))}


def stop_rules(job: LoadJob, plan: WindowPlan, llm: LlmSettings) -> tuple[StopRule, ...]:
    """When the load process stops a job's run (none: at the plan's end): after ``llm.requests`` measured
    requests, within the job's time limit; and a max-goodput step of an open loop once the server falls behind its
    arrivals (``saturation.OverSaturation``)."""
    rules: list[StopRule] = []
    if llm.requests is not None:
        rules += [RequestCount(llm.requests), Duration(job.settings.timeout_s)]
    if job.settings.search == "max-goodput" and job.load.rate is not None:
        rules.append(OverSaturation.of(plan.measured_s, job.load.rate))
    return tuple(rules)


class OpenAIClient(LoadClient):
    """Streams OpenAI chat or completion requests from a process of its own (``openai_http``)."""

    name = "openai"
    label = "farm's OpenAI client"
    title = "farm's OpenAI streaming client"
    stops_when_stable = False

    def why_not(self, job: LoadJob) -> str | None:
        if job.settings.llm is None:
            return "it drives LLM servers over the OpenAI API: give --api openai-chat|openai-completions"
        return None

    def run(self, job: LoadJob, plan: WindowPlan) -> LoadRecord:
        llm = job.settings.llm
        assert llm is not None
        url = llm.base_url(job.url)
        try:
            key = _key(job, llm)
            check_model(url, job.model_name, Auth(key=key), job.connect_timeout_s, job.authority)
            own = server_tokenizer(url.removesuffix(llm.base_path), job.model_name, key, job.authority)
            said = probe(url, llm.api, job.model_name, key, job.authority)
            ask = Asked(ignore_eos=said.ignore_eos,
                        cut_by=f"the server's tokenizer ({own.route.name} {own.route.tokenize})" if own else None)
            # a chat prompt's count includes the template's tokens: measured on the probe's prompt
            framed = (PROBE_TEXT, said.prompt_tokens) if llm.api == "openai-chat" and said.prompt_tokens else None
            with open_workload(llm, server=own, framed=framed) as (prompts, tok):
                salts = Salts.of(own or tok)
                cache = prefix_cache.prepare(llm, url, job.model_name, key, job.authority, prompts, salts, job.load)
                ask = replace(ask, cut_by=ask.cut_by or ("--tokenizer" if tok is not None else "words"), cache=cache)
                got, server, scrapes = self._drive(job, plan, llm, key, prompts, replace(ask, salts=salts),
                                            replay_pattern(job.pattern, llm))
                if tok is not None:  # the run's texts counted in the jail in a few round trips
                    tok.prefetch(_texts(got))
                return _record(job, plan, llm, got, tok.count if tok is not None else None, server, scrapes, ask)
        except (ConnectionError, FarmError) as exc:
            raise LoadGenError(str(exc)) from None

    def _drive(self, job: LoadJob, plan: WindowPlan, llm: LlmSettings, key: str | None,
               prompts: list[Prompt], ask: Asked, pattern: LoadPattern
               ) -> tuple[HttpRun, dict[str, dict[str, float]], Scrapes]:
        """The load process's run of ``prompts`` at ``pattern``, the server's own p50s and p99s (its Prometheus
        histograms, ms, by figure) and its ``/metrics`` scraped through the run (``server_scrape``)."""
        url = llm.base_url(job.url)
        http = HttpJob(base_url=url, api=llm.api, model=job.model_name, prompts=tuple(prompts), pattern=pattern,
                       plan=plan, authority=job.authority, max_in_flight=job.in_flight_cap,
                       max_response_bytes=get_settings().max_response_bytes, stops=stop_rules(job, plan, llm),
                       warmup_requests=llm.warmup_requests, request_timeout_s=llm.request_timeout_s, seed=job.seed,
                       salts=ask.salts, ignore_eos=ask.ignore_eos, think_s=llm.think_ms / 1e3,
                       cold_warmup=ask.cache is not None and ask.cache.state == "cold" and llm.shared_tokens() > 0)
        limit = (job.settings.timeout_s if llm.requests is not None else plan.span_s) + WAIT_MARGIN_S + 5.0
        metrics_url = url.removesuffix(llm.base_path) + "/metrics"
        with scraping(metrics_url, job.authority) as scraper, load_process(http, key) as (wait, t_start):
            if t_start is not None:  # the server's own histograms from the warm-up's end
                time.sleep(max(0.0, t_start + plan.warmup_s - time.monotonic()))
            before = scrape(metrics_url, authority=job.authority) if t_start is not None else None
            got = wait(limit)
            scrapes = scraper.stop()
        if got is None:
            raise LoadGenError(f"the OpenAI load process did not report within {limit:.0f} s; check the server")
        if isinstance(got, str):
            raise LoadGenError(got)
        after = scrape(metrics_url, authority=job.authority) if before is not None else None
        return got, server_quantiles(before, after) if before is not None else {}, scrapes


@dataclass(frozen=True)
class Asked:
    """How the run asks for the workload: whether outputs are asked to ignore the end of sequence, the salts,
    what cut the prompts (the server's tokenizer, ``--tokenizer`` or words) and the server's prefix cache."""

    ignore_eos: bool = False
    salts: Salts = Salts(tuple(WORDS))
    cut_by: str | None = None
    cache: CachePrep | None = None  # what was done to the server's prefix cache before the load


def _key(job: LoadJob, llm: LlmSettings) -> str | None:
    """The bearer token of an endpoint job naming an operator's credential, read now on this worker; None for a
    server farm started (a jailed server never sees an operator's secret) or without a credential."""
    if llm.credential is None or job.authority is None:
        return None
    return credential_value(llm.credential, job.authority)


def _trace_details(llm: LlmSettings) -> dict[str, Any]:
    """The trace a replay sent and its scales (none without a trace)."""
    if llm.trace is None:
        return {}
    return {"trace": file_label(llm.trace), "trace_speed": llm.trace_speed, "trace_tokens": llm.trace_tokens,
            "trace_limit": llm.trace_limit}


def _cache_details(llm: LlmSettings, cache: CachePrep | None) -> dict[str, str | int]:
    """The prefix-cache state a job asked for, its shared prefix and what was done before the load."""
    if cache is None:
        return {}
    return {"prefix_cache": cache.state, "shared_prefix_tokens": llm.shared_tokens(), "prefix_cache_prep": cache.how}


def _float(value: object) -> float | None:
    return value if isinstance(value, float) else None


def _client_run(run: HttpRun, count: Callable[[str], int] | None) -> dict[str, int]:
    """The client's own totals over the whole run, warm-up included (what the server's counters over the whole
    scrape span must equal): requests completed, their prompt and output tokens, and requests cut off at the end
    (their tokens are the server's only)."""
    done = [account(r, count) for r in run.records if r.error is None]
    return {"requests": len(done), "prompt_tokens": sum(o.input_tokens for o in done),
            "generation_tokens": sum(o.output_tokens for o in done), "cut": len(run.cut)}


def _texts(run: HttpRun) -> list[str]:
    """Every text the accounting may count: each chunk's, and each request's whole answer."""
    out: list[str] = []
    for rec in (*run.records, *run.cut):
        out += rec.chunk_text
        out.append("".join(rec.chunk_text))
    return out


def _record(job: LoadJob, plan: WindowPlan, llm: LlmSettings, run: HttpRun,
            count: Callable[[str], int] | None, histograms: dict[str, dict[str, float]], scrapes: Scrapes,
            ask: Asked | None = None) -> LoadRecord:
    """The record of a finished run (``histograms``: the p50s and p99s of the server's Prometheus histograms, ms,
    by figure; ``scrapes``: its ``/metrics`` through the run); LoadGenError when no measured request succeeded."""
    windows = _windows(run, plan, llm.requests is not None)
    cut = _cut(run, windows, count)
    figures = [WindowFigures.measure(k, a - windows[0][0], b - a, np.asarray([o.e2e_ms for o in outs]),
                                     sum(errs.values()), 1)
               for k, ((a, b), outs, errs) in enumerate(zip(windows, cut.outcomes, cut.errors, strict=True))]
    outcomes = [o for outs in cut.outcomes for o in outs]
    errors: Counter[str] = sum(cut.errors, Counter())
    if not outcomes:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or (
            f"no request ended in the windows: {run.sent} sent, {run.in_flight} still in flight at the end, "
            f"{cut.warm_ok} in the warm-up; lengthen --duration or give --requests")
        raise LoadGenError(f"no request succeeded while measuring ({counts}; first error: "
                           f"{_first_error(run.records) or 'none'}); check the model name, the API "
                           "(--api) and the server log")
    duration = sum(b - a for a, b in windows)
    ask = ask or Asked()
    checks = workload_metrics(outcomes)
    totals = RunTotals(lat_ms=np.asarray([o.e2e_ms for o in outcomes]), queue_ms=np.empty(0),
                       compute_ms=np.empty(0), duration_s=duration, errors=dict(errors), sent=run.sent,
                       late=run.late, busy_by_process=[run.busy_pct],
                       stable=judge_stable(figures, job.settings))
    per_chunk = [o.output_tokens / o.chunks for o in outcomes if o.chunks]
    overruns = sum(o.overrun for o in outcomes)
    notes = []
    if overruns:
        notes.append(f"{overruns} of {len(outcomes)} requests generated more tokens than their max_tokens: the "
                     "server ignores or overruns the limit (output_overrun_count)")
    if run.oversaturated:
        notes.append(f"{run.oversaturated}: the step was stopped early; its requests cut off count against the SLO")
    view_metrics, view = summarise(scrapes, windows)
    view["client_run"] = _client_run(run, count)
    view["histograms"] = histograms
    server = {figure: q["p50"] for figure, q in histograms.items()}
    if not view["available"]:
        notes.append(NO_METRICS_NOTE.format(why=view["why"] or "no answer"))
    if "chunks" in _sources(outcomes)["output"]:
        notes.append("output tokens counted one per chunk: the server sent no usage and no --tokenizer was given")
    notes += workload_notes(checks, llm.api, llm.shared_tokens(), ask.ignore_eos, llm.sessions is not None)
    turns = turn_figures(outcomes)
    log, tools = recorded(run, count, get_settings().event_log_max_chunks, get_settings().event_log_max_requests)
    asked_in = checks["requested_input_tokens_mean"]
    cache_metrics, cache_notes = prefix_cache.judge(
        llm, ask.cache, asked_in if isinstance(asked_in, float) else None,
        _float(checks["cached_prompt_tokens_pct"]), view, len(outcomes), job.load)
    notes += cache_notes
    own = OpenAIDetails(api=llm.api, base_url=llm.base_url(job.url), model=job.model_name,
                        token_sources=_sources(outcomes),
                        tokens_per_chunk_mean=stats.mean(per_chunk), tokens_per_chunk_max=max(per_chunk, default=None),
                        output_overruns=overruns, slo=llm.slo.model_dump() if llm.slo else None,
                        workload={"input_tokens": llm.input_tokens.text(), "output_tokens": llm.output_tokens.text(),
                                  "prefix_tokens": llm.prefix_tokens, "seed": llm.seed,
                                  "prompts": file_label(llm.prompts), "tokenizer": file_label(llm.tokenizer),
                                  "prompts_cut_by": ask.cut_by, "ignore_eos": ask.ignore_eos,
                                  "salt_words": len(ask.salts.words), **_trace_details(llm),
                                  **({"sessions": llm.sessions, "think_ms": llm.think_ms} if llm.sessions else {}),
                                  **_cache_details(llm, ask.cache)},
                        first_error=_first_error(run.records), warmup_errors=cut.warm_errors,
                        in_flight_at_end=run.in_flight, event_loop=run.loop, server_metrics=server,
                        send_lag_ms=_p50_p99([o.send_lag_ms for o in outcomes if o.send_lag_ms is not None]),
                        loop_lag_ms=_p50_p99(run.loop_lag_ms),
                        slo_met_share=slo_share(outcomes, sum(errors.values()), run.unfinished, llm.slo),
                        oversaturated=run.oversaturated is not None, oversaturated_why=run.oversaturated,
                        server_view=view, session_turns=turns, event_log=log, tool_figures=tools)
    metrics = llm_metrics(outcomes, duration, llm.slo, tokens_in(run, windows, count, outcomes),
                          tokens_in(run, windows, count, outcomes, "reasoning"))
    metrics.update(checks)
    metrics.update(turn_metrics(turns))
    metrics.update(cache_metrics)
    metrics.update({k: v for k, v in view_metrics.items() if v is not None})
    for figure, value in server.items():  # Prometheus where the server gave no per-request timings
        if metrics.get(f"server_{figure}_p50_ms") is None:
            metrics[f"server_{figure}_p50_ms"] = value
    return LoadRecord(client=OpenAIClient.name, label=OpenAIClient.label, client_process="own process",
                      rpc=LLM_RPC, processes=1, windows=figures, metric_windows=slice(0, len(figures)), totals=totals,
                      stopped_when_stable=False, warmup_requests=cut.warm_ok, notes=notes, own=own,
                      metrics=metrics)

"""Quick search over the load level (concurrency, or the request rate in open loop), per serving
configuration: reading a request's measured steps and turning the next decisions (``scheduler.search_rules``,
pure) into jobs (``advance``).

A serving configuration is a job's coordinates less its load (``schemas.LOAD_KEYS``), i.e. its device,
engine, batch size and the ``SERVING_KEYS`` of its measurement. Its search space is the request's
concurrency list, or in open loop (``--mode constant|poisson``) its rates, ascending
(``ProfileRequest.search_load``); ``scheduler.search_rules`` decides the next level.

The next step of a search is enqueued when the previous result lands: ``advance`` is called after every
result write of a search job (``workers.ledger.finish``) and on every reconciliation pass, so a worker
dying mid-step only delays the search (its job is requeued like any other).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NotRequired, TypedDict

from sqlalchemy import select

from farm.db.models import Job, Request, RequestOwner, Result, utcnow
from farm.db.session import dialect_insert, session_scope
from farm.readers.report import SERVING_GROUP
from farm.readers.results import find_request
from farm.settings import get_settings
from scheduler.enqueue import enqueue_jobs, job_rows
from scheduler.expand import job_id_for
from scheduler.goodput_rules import GoodputDecision, RateStep, decide_rate, step_duration
from scheduler.search_rules import Decision, Step, decide, label
from schemas import SERVING_KEYS, JobSpec, MeasurementSettings, ProfileRequest
from schemas.job import FINAL, JobStatus
from schemas.llm import cache_state_of
from schemas.load import LoadDetails


def serving_key(spec: dict[str, Any]) -> tuple[Any, ...]:
    """A job spec's (JSON) serving configuration: its coordinates less its load (concurrency and rate), and
    an LLM engine's knobs (and a warm prefix cache, ``prefix_cache``, beside them)."""
    m = spec.get("measurement") or {}
    warm = (("prefix_cache", "warm"),) if cache_state_of(m) == "warm" else ()  # a warm cache searches on its own
    knobs = tuple(sorted((spec.get("knobs") or {}).items())) + warm
    return (*(m.get(k) if k in SERVING_KEYS else spec[k] for k in SERVING_GROUP), knobs)


def serving_config(key: tuple[Any, ...]) -> dict[str, Any]:
    """A ``serving_key`` as a dict: the ``SERVING_GROUP`` coordinates, and ``knobs`` when the jobs have any."""
    config = dict(zip(SERVING_GROUP, key[:-1], strict=True))
    return {**config, "knobs": dict(key[-1])} if key[-1] else config


SEARCH_LOOKBACK_S = 3600.0  # reconciliation advances the searches of requests with a job finished this recently


@dataclass
class SearchState:
    """Where one serving configuration's search stands: its measured steps, the step being measured
    (None: none) and the decision once nothing is pending."""

    key: tuple[Any, ...]
    steps: list[Step]
    pending: int | float | None
    decision: Decision | GoodputDecision | None
    template: dict[str, Any]  # a job spec (JSON) of this configuration, for its next steps
    load: str = "concurrency"  # what the search walks: concurrency, or the open-loop rate
    rate_steps: list[RateStep] = field(default_factory=list)  # a max-goodput search's steps
    slo: str = ""  # a max-goodput search's SLO, for its line (``Slo.text``)
    asked: MeasurementSettings | None = None  # the request's measurement (a max-goodput step's time follows it)

    def describe(self) -> str:
        """One line for ``farm status``: ``measuring c=4 (measured c=1,2)``, ``... rate=100/s (...)``."""
        head, unit = ("rate=", "/s") if self.load == "rate" else ("c=", "")
        levels = ",".join(f"{s.level:g}" for s in sorted(self.steps, key=lambda s: s.level))
        measured = f"{head}{levels}{unit}" if levels else "none yet"
        if self.pending is not None:
            return f"measuring {label(self.pending, self.load)} (measured {measured})"
        assert self.decision is not None
        if isinstance(self.decision, GoodputDecision):
            return goodput_line(self.decision, self.rate_steps, self.slo)
        best = self.decision.best
        pick = (f"; best {label(best.level, self.load)} {best.throughput:.1f} infer/s"
                if best and best.throughput else "")
        return f"{self.decision.reason} (measured {measured}){pick}"


def goodput_line(decision: GoodputDecision, steps: list[RateStep], slo: str) -> str:
    """A max-goodput search's state in one line: ``max goodput rate 12.5 req/s within ttft<=200 ms, tpot<=50 ms
    (rate=13.1/s 80% within the SLO); goodput 12.3 req/s, 97% within the SLO; 6 steps`` once done."""
    n = f"{len(steps)} step{'s' if len(steps) != 1 else ''}"
    best = decision.best
    got = (f"; goodput {best.goodput:.2f} req/s, {best.share:.0%} within the SLO"
           if best and best.goodput is not None and best.share is not None else "")
    reason = decision.reason.replace(" req/s", f" req/s within {slo}", 1) if slo else decision.reason
    return f"{reason}{got}; {n}"


def search_states(bind: Any, request_id: str) -> list[SearchState]:
    """The searches of a request, quick or max-goodput, one per serving configuration (empty for brute force)."""
    spec = bind.execute(select(Request.spec).where(Request.id == request_id)).scalar_one_or_none()
    if spec is None:
        return []
    request = ProfileRequest.model_validate(spec)
    kind = request.measurement.search
    if kind == "brute":
        return []
    load = "rate" if kind == "max-goodput" else request.search_load()
    metrics = [getattr(Result, n) for n in ("throughput_infer_per_s", "latency_p99_ms", "goodput_req_per_s")]
    rows = bind.execute(select(Job.spec, Job.status, Job.concurrency, Job.rate, *metrics, Result.details)
                        .outerjoin(Result, Result.job_id == Job.id)
                        .where(Job.request_id == request_id, Job.edge_profile.is_(None))).all()
    states: dict[tuple[Any, ...], SearchState] = {}
    cancelled: set[tuple[Any, ...]] = set()
    slo = request.measurement.llm.slo.text() if request.measurement.llm and request.measurement.llm.slo else ""
    for job_spec, status, c, rate, tput, p99, goodput, details in rows:
        key = serving_key(job_spec)
        st = states.setdefault(key, SearchState(key, [], None, None, job_spec, load, slo=slo,
                                                asked=request.measurement))
        level = c if load == "concurrency" else rate
        if status not in FINAL:
            st.pending = level
            continue
        ok = status == JobStatus.succeeded and tput is not None
        st.steps.append(Step(level, tput if ok else None, p99 if ok else None))
        if kind == "max-goodput":
            st.rate_steps.append(rate_step(rate, goodput, details if ok else None))
        if status == JobStatus.cancelled:
            cancelled.add(key)
    for st in states.values():
        if st.pending is None:
            st.decision = _decision(request, st, st.key in cancelled)
    return list(states.values())


def rate_step(rate: float, goodput: float | None, details: dict[str, Any] | None) -> RateStep:
    """A max-goodput step from its job's rate (requests/s), goodput and result details (None: the job failed):
    the share within the SLO and the over-saturation stop are the OpenAI client's ``slo_met_share`` and
    ``oversaturated`` (in the load client's details, ``details.load``)."""
    load = LoadDetails.of(details)
    if load.slo_met_share is None:
        return RateStep(rate, None)
    return RateStep(rate, load.slo_met_share, load.oversaturated, goodput)


def _decision(request: ProfileRequest, st: SearchState, cancelled: bool) -> Decision | GoodputDecision:
    """What the search of ``st`` does next (nothing once a step was cancelled: farm cancel, or an interrupt)."""
    m = request.measurement
    if m.search == "max-goodput":
        assert m.rate is not None  # a max-goodput measurement is open loop (schemas.request)
        got = decide_rate(m.rate, st.rate_steps)
        if cancelled and not got.done:
            return GoodputDecision(None, got.best, got.ceiling, "stopped: a step was cancelled")
        return got
    quick = decide(request.search_levels(), st.steps, m.p99_ms, st.load)
    if cancelled and not quick.done:
        return Decision(None, quick.best, "stopped: a step was cancelled")
    return quick


def next_steps(bind: Any, request_id: str) -> list[tuple[str, str]]:
    """Insert the next step (a queued job) of every search of the request that is waiting for one; returns
    the (job id, queue) pairs inserted. Idempotent: a step's job id is deterministic, and a job already
    there (another worker advanced the same search) is left alone."""
    new: list[JobSpec] = []
    for st in search_states(bind, request_id):
        if st.decision is None or st.decision.next is None:
            continue
        t = {k: v for k, v in st.template.items() if k != "load"}  # the step's load: from c and m below
        c, m = t["concurrency"], t["measurement"]
        if isinstance(st.decision, GoodputDecision):
            asked = st.asked or MeasurementSettings()  # the request's own, not a lengthened step's
            m = {**m, "rate": st.decision.next, "duration_s": step_duration(
                asked.duration_s, asked.max_windows * asked.window_s, st.decision.next)}
        elif st.load == "rate":
            m = {**m, "rate": st.decision.next}
        else:
            c = st.decision.next
        job_id = job_id_for(request_id, t["device"], t["engine"], t["batch_size"], c, None, m, t.get("knobs"))
        new.append(JobSpec.model_validate({**t, "concurrency": c, "measurement": m, "job_id": job_id}))
    if not new:
        return []
    stmt = (dialect_insert(bind, Job.__table__).values(job_rows(request_id, new))  # type: ignore[arg-type]
            .on_conflict_do_nothing(index_elements=["id"]).returning(Job.__table__.c.id))
    inserted = set(bind.execute(stmt).scalars().all())
    return [(j.job_id, j.queue) for j in new if j.job_id in inserted]


def advance(request_id: str) -> list[tuple[str, str]]:
    """Enqueue the next steps of the request's searches (sent to the broker in cluster mode, or held for
    ``scheduler.fairshare.release`` when the request came through the API; the embedded loop picks queued jobs
    up itself); returns the (job id, queue) pairs added."""
    with session_scope() as s:
        added = next_steps(s, request_id)
        owned = s.get(RequestOwner, request_id) is not None  # an API request's steps wait for fair share's release
    if added and not owned and not get_settings().embedded:
        enqueue_jobs(added)
    return added


def advance_recent(now: Any = None) -> list[tuple[str, str]]:
    """Reconciliation's catch-up: advance the searches of requests with a job finished in the last
    ``SEARCH_LOOKBACK_S`` (a worker may have died between writing a result and enqueuing the next step)."""
    since = (now or utcnow()) - timedelta(seconds=SEARCH_LOOKBACK_S)
    searched = Request.spec["measurement"]["search"].as_string().in_(("quick", "max-goodput"))
    with session_scope() as s:
        ids = s.execute(select(Job.request_id).join(Request, Request.id == Job.request_id)
                        .where(Job.finished_at >= since, searched).distinct()).scalars().all()
    return [pair for rid in ids for pair in advance(rid)]


class QuickBest(TypedDict, total=False):
    """A quick search's best step: its level (``concurrency`` or ``rate``, what the search walks), inferences/s
    and p99 latency (ms)."""

    concurrency: int | float
    rate: int | float
    throughput_infer_per_s: float | None
    latency_p99_ms: float | None


class GoodputBest(TypedDict):
    """A max-goodput search's answer step: its rate and goodput (requests/s) and share of requests within the SLO."""

    rate: float
    goodput_req_per_s: float | None
    slo_met_share: float | None


class SearchRow(TypedDict):
    """Where one search stands (:func:`search_report`); a max-goodput search adds its ``steps``, its answer
    (``max_goodput_rate``) and the failing rate above it (``fails_at``)."""

    config: dict[str, Any]
    load: str
    kind: str
    state: str
    done: bool
    measured: list[int | float]
    best: QuickBest | GoodputBest | None
    steps: NotRequired[int]
    max_goodput_rate: NotRequired[float | None]
    fails_at: NotRequired[float | None]


def search_report(request_id: str) -> list[SearchRow]:
    """Where each search of the request stands, for ``farm status`` (empty for brute force): its serving
    configuration, what it walks (``load``: concurrency or rate), state line, whether it is done, the levels
    measured and its best step (a max-goodput search: its answer, ``max_goodput_rate``, and the failing rate
    above it, ``fails_at``)."""
    rid = find_request(request_id).id
    with session_scope() as s:
        states = search_states(s, rid)
    out: list[SearchRow] = []
    for st in states:
        row = SearchRow(config=serving_config(st.key), load=st.load, kind="quick", state=st.describe(),
                        done=bool(st.decision and st.decision.done), measured=sorted(s.level for s in st.steps),
                        best=None)
        if isinstance(st.decision, GoodputDecision):
            b = st.decision.best
            row["kind"], row["steps"] = "max-goodput", len(st.rate_steps)
            row["max_goodput_rate"], row["fails_at"] = b.rate if b else None, st.decision.ceiling
            row["best"] = None if b is None else GoodputBest(rate=b.rate, goodput_req_per_s=b.goodput,
                                                             slo_met_share=b.share)
        elif st.decision is not None and (best := st.decision.best) is not None:
            row["best"] = (QuickBest(rate=best.level, throughput_infer_per_s=best.throughput,
                                     latency_p99_ms=best.p99_ms) if st.load == "rate" else
                           QuickBest(concurrency=best.level, throughput_infer_per_s=best.throughput,
                                     latency_p99_ms=best.p99_ms))
        out.append(row)
    return out


def searches_done(request_id: str) -> bool:
    """Whether every search of the request has decided to stop (True for brute force)."""
    return all(r["done"] for r in search_report(request_id))

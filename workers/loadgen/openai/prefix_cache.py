"""The server's prefix cache as a job dimension (``LlmSettings.prefix_cache``, ``shared_prefix_pct``): put it in
the state the job asks for before the load, and judge afterwards whether the server served from it what the
workload implies.

- ``cold``: the cache reset where the engine has a route for it (vLLM: ``POST /reset_prefix_cache``, served with
  ``VLLM_SERVER_DEV_MODE=1``; llama-server: ``POST /slots/{id}?action=erase`` for each slot ``GET /slots`` lists,
  where it runs with ``--slot-save-path``: its host-memory prompt cache, ``--cache-ram``, has no such route and
  keeps its prompts, which the row's note says); a server farm launched for the job by the process runner starts
  empty anyway. The warm-up requests then carry
  their salt in front of the shared prefix (``HttpJob.cold_warmup``), so they warm the server without putting the
  measured requests' prefix in its cache.
- ``warm``: the job's first prompt (the shared prefix, then a salt of its own) sent ``concurrency`` times at once
  before the load (a server with per-slot caches, llama-server's, gets it in each slot the load will use).

The intended hit rate (% of the measured prompt tokens the cache can serve): warm, the shared prefix's share of a
prompt; cold, that share over the requests after the first ones that found the cache empty (a closed loop's
``concurrency`` first requests, an open loop's first). The measured one is the server's: the cached tokens its
``usage`` reported for the measured requests (``cached_prompt_tokens_pct``), else its prefix-cache counters over
the windows where its ``/metrics`` has them (vLLM: hits / queries; llama-server: cached / (evaluated + cached)
prompt tokens; a scrape's interval at the windows' edges holds other requests too). A row whose
two differ by more than :data:`SLACK_PTS` points is flagged (``prefix_hit_as_intended`` false, and a note)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from schemas.llm import LlmSettings
from schemas.load_levels import ClosedLoop, OpenLevel
from workers.loadgen.openai.http_once import exchange
from workers.loadgen.openai.load_loop import headers, route
from workers.loadgen.openai.request import request_body
from workers.loadgen.openai.workload import Prompt, Salts

#: the most points the measured prefix-cache hit rate may differ from the intended one before the row is flagged
SLACK_PTS = 10.0
TIMEOUT_S = 60.0  # one reset or warming exchange, s
WARM_MAX = 64  # the most warming requests sent at once
LIMIT = 1 << 20  # the most bytes of one answer read


@dataclass(frozen=True)
class CachePrep:
    """What was done to the server's prefix cache before the load: the job's ``state`` (cold, warm) and ``how``
    (the route that reset it, the warming requests answered, or why nothing was done); ``done``: whether it is
    in the state asked."""

    state: str
    how: str
    done: bool
    caveat: str = ""  # what the reset leaves behind, said in the row's notes where the hits are not as intended


def _post(url: str, key: str | None, authority: str | None, body: bytes = b"") -> int:
    """The status of ``POST url`` (0: no answer)."""
    try:
        return exchange(url, method="POST", body=body, headers=headers(key), timeout_s=TIMEOUT_S, limit=LIMIT,
                        authority=authority)[0]
    except OSError:
        return 0


def _llama_slots(root: str, key: str | None, authority: str | None) -> list[int]:
    """The slot ids llama-server's ``GET /slots`` lists (none: no such route)."""
    try:
        status, raw = exchange(f"{root}/slots", headers=headers(key), timeout_s=TIMEOUT_S, limit=LIMIT,
                               authority=authority)
        slots = json.loads(raw) if status == 200 else []
    except (OSError, ValueError):
        return []
    return [s["id"] for s in slots if isinstance(s, dict) and isinstance(s.get("id"), int)] \
        if isinstance(slots, list) else []


def reset(root: str, key: str | None, authority: str | None) -> CachePrep:
    """The server at ``root`` (``http://HOST:PORT``) with its prefix cache emptied, where a route allows it."""
    if _post(f"{root}/reset_prefix_cache", key, authority) == 200:
        return CachePrep("cold", "reset (POST /reset_prefix_cache)", True)
    slots = _llama_slots(root, key, authority)
    erased = sum(_post(f"{root}/slots/{i}?action=erase", key, authority) == 200 for i in slots)
    if slots and erased == len(slots):
        # the slots' caches only: llama-server's prompt cache in host memory (--cache-ram, 8 GiB by default) keeps
        # what it holds, and a later request restores a prompt from it (benchmarks/real_traffic.py: a trace
        # replayed again after the erase hit 70.9 % where 60.4 % was implied)
        return CachePrep("cold", f"reset ({erased} slots erased: POST /slots/ID?action=erase)", True,
                         "llama-server's host-memory prompt cache (--cache-ram, on by default) has no reset route "
                         "and keeps its prompts: serve it with --cache-ram 0 for a cold cache")
    why = (f"llama-server refused to erase {len(slots) - erased} of its {len(slots)} slots (it needs "
           "--slot-save-path)" if slots else "the server has no reset route (POST /reset_prefix_cache, /slots)")
    return CachePrep("cold", f"not reset: {why}", False)


def warm(base_url: str, api: str, model: str, key: str | None, authority: str | None, prompt: Prompt,
         salt: str, n: int) -> CachePrep:
    """The shared prefix put in the server's cache: ``prompt`` (one of the job's, salted with ``salt``, one
    output token) sent ``n`` times at once (capped at :data:`WARM_MAX`)."""
    body = request_body(api, model, replace(prompt, max_tokens=1), False, salt)
    url = base_url + route(api)
    k = max(1, min(n, WARM_MAX))
    with ThreadPoolExecutor(k, thread_name_prefix="farm-warm") as pool:
        answered = sum(s == 200 for s in pool.map(lambda _: _post(url, key, authority, body), range(k)))
    return CachePrep("warm", f"warmed ({answered} of {k} requests of the shared prefix answered)", answered > 0)


def prepare(llm: LlmSettings, base_url: str, model: str, key: str | None, authority: str | None,
            prompts: list[Prompt], salts: Salts, load: ClosedLoop | OpenLevel) -> CachePrep:
    """Put the server's prefix cache in ``llm.cache_state`` before the load (see the module docstring)."""
    if llm.cache_state == "cold":
        return reset(base_url.removesuffix(llm.base_path), key, authority)
    if not llm.shared_tokens() or not prompts:
        return CachePrep("warm", "nothing to warm: the workload shares no prefix", True)
    return warm(base_url, llm.api, model, key, authority, prompts[0], salts.started().salt(0), load.concurrency)


def intended_pct(state: str, share_pct: float, requests: int, load: ClosedLoop | OpenLevel) -> float:
    """The share (%) of the measured prompt tokens a prefix cache in ``state`` can serve: ``share_pct`` (the
    shared prefix's share of a prompt) warm; cold, over the ``requests`` after those that found it empty."""
    if state == "warm" or not requests:
        return share_pct
    first = load.concurrency if isinstance(load, ClosedLoop) else 1
    return share_pct * max(0, requests - first) / requests


def _dict(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def measured_pct(view: Mapping[str, object], usage_pct: float | None) -> tuple[float | None, str | None]:
    """The server's prefix-cache hit rate over the windows (%) and where it came from: its usage (``usage_pct``:
    the cached prompt tokens it reported for exactly the measured requests) where it gave one, else its counters
    (hits / queries: ``server_scrape``'s ``windows``), which also count the requests a scrape's interval (up to
    250 ms at 4 Hz, more on a busy host) holds beyond the windows' edges: the warm-up's last ones among them."""
    if usage_pct is not None:
        return usage_pct, "usage"
    figures, names = _dict(view.get("windows")), _dict(view.get("names"))
    hits, queries = figures.get("cached_prompt_tokens"), figures.get("prefix_cache_queries")
    if queries is None and str(names.get("cached_prompt_tokens", "")).startswith("llamacpp:"):
        done = figures.get("prompt_tokens")  # llama-server counts the prompt tokens it evaluated, cached ones apart
        queries = done + hits if isinstance(done, float | int) and isinstance(hits, float | int) else None
    if isinstance(hits, float | int) and isinstance(queries, float | int) and queries > 0:
        return 100.0 * hits / queries, "server counters"
    return None, None


Judged = tuple[dict[str, float | bool | None], list[str]]  # a row's prefix-cache metrics and notes


def judge(llm: LlmSettings, prep: CachePrep | None, asked_in: float | None, usage_pct: float | None,
          view: Mapping[str, object], requests: int, load: ClosedLoop | OpenLevel) -> Judged:
    """The row's prefix-cache metrics (``prefix_hit_intended_pct``, ``prefix_hit_pct``, ``prefix_hit_as_intended``)
    and notes: ``asked_in``: the mean prompt tokens the workload meant (None: ``llm``'s own mean)."""
    if prep is None or llm.prompts is not None or llm.trace is not None:
        return {}, []  # a prompt file or a trace: its own sharing, not the dimension's
    share = 100.0 * llm.shared_tokens() / asked_in if asked_in else llm.shared_share_pct()
    intended = intended_pct(prep.state, share, requests, load)
    got, source = measured_pct(view, usage_pct)
    ok = None if got is None else abs(got - intended) <= SLACK_PTS
    notes = [] if prep.done or not llm.shared_tokens() else [
        f"prefix cache {prep.state} asked but {prep.how}; a server farm started for this job starts empty"]
    if ok is False:
        notes.append(f"prefix-cache hits not as intended: the server served {got:.0f} % of the prompt tokens from its "
                     f"cache ({source}), where a {prep.state} cache and a {share:.0f} % shared prefix imply "
                     f"{intended:.0f} % (prefix_hit_as_intended)" + (f"; {prep.caveat}" if prep.caveat else ""))
    return {"prefix_hit_intended_pct": intended, "prefix_hit_pct": got, "prefix_hit_as_intended": ok}, notes

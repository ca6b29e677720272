"""farm.readers.knee_cause and farm.readers.ttft_split: what bounds each LLM sweep at its knee (slots, memory,
compute, client; what cannot be judged without the server's view) and each job's TTFT split into the server's
queue + prefill and the rest, on rows as the readers get them."""
from __future__ import annotations

from typing import Any

import pytest

from farm.readers.knee_cause import knee_causes
from farm.readers.rows import ResultRow
from farm.readers.ttft_split import LITTLE, NO_SPLIT, ttft_split

#: llama-server's own view, as the server_* columns hold it, where nothing bounds the sweep
CALM = {"server": "llama-server b6000", "server_scrapes": 20, "server_requests_running_max": 4.0,
        "server_requests_running_mean": 2.0, "server_requests_waiting_mean": 0.0,
        "server_kv_cache_usage_max_pct": 30.0, "client_busy_pct": 20.0}


def row(c: float, tps: float, label: str, rate: float | None = None, **kw: Any) -> ResultRow:
    """One succeeded closed-loop (or open-loop at ``rate``) row of sweep ``cpu llama.cpp LABEL``."""
    return ResultRow({"job_id": f"{label}-{c}-{rate}", "device": "cpu", "engine": "llama.cpp", "batch_size": 1,
                      "knob_set": label, "edge_profile": None, "concurrency": c if rate is None else 1, "rate": rate,
                      "status": "succeeded", "output_tokens_per_s": tps, **kw})


def sweep(label: str, tps: tuple[float, ...], per_point: list[dict[str, Any]]) -> list[ResultRow]:
    """A concurrency sweep 1, 2, 4, ... of ``label`` with ``tps`` and each point's figures over :data:`CALM`."""
    return [row(2 ** i, y, label, **{**CALM, **f}) for i, (y, f) in enumerate(zip(tps, per_point, strict=True))]


CURVE = (100.0, 190.0, 200.0)  # the knee is c=2: 2 -> 4 gains 5 %


def by_sweep(rows: list[ResultRow]) -> dict[str, Any]:
    return {c.sweep + (" rate" if c.knee.by == "rate" else ""): c for c in knee_causes(rows)}


def test_one_slot_bounds_the_sweep_where_the_queue_grows_at_constant_running_requests() -> None:
    at_max = {"server_requests_running_max": 2.0, "server_requests_running_mean": 1.9}
    rows = sweep("n_parallel=2", CURVE, [{"server_requests_running_max": 1.0, "server_requests_running_mean": 0.7},
                                         {**at_max, "server_requests_waiting_mean": 0.1},
                                         {**at_max, "server_requests_waiting_mean": 0.4}])
    (cause,) = knee_causes(rows)
    assert cause.knee.concurrency == 2 and [c for c, _ in cause.causes] == ["slots"]
    assert [c for c, _ in cause.unjudged] == ["compute"]  # no prefill time stored
    text = cause.text()
    assert text.startswith("cpu llama.cpp n_parallel=2: knee at c=2: 190 tok/s; bounded by: the queue grows at "
                           "constant running requests (slots / max_num_seqs): requests running (mean/max) 1.9/2 → "
                           "1.9/2, waiting (mean) 0.1 → 0.4 (c=2 → c=4)"), text
    below_max = sweep("n_parallel=2", CURVE, [{}, {}, {"server_requests_waiting_mean": 1.0}])
    assert knee_causes(below_max)[0].causes == []  # 2 of 4 running on average: not held at the slots
    slots = sweep("n_parallel=1", CURVE, [{"knobs": {"n_parallel": 1}, "server_requests_running_max": 1.0,
                                           "server_requests_running_mean": m, "server_requests_waiting_mean": w}
                                          for m, w in ((0.9, 0.0), (0.7, 0.0), (0.67, 0.33))])
    (by_knob,) = knee_causes(slots)  # the knob names the slots: running at them, though idle a third of the time
    assert [c for c, _ in by_knob.causes] == ["slots"]
    assert "requests running (mean/max) 0.7/1 → 0.67/1 of 1 slots, waiting (mean) 0 → 0.33" in by_knob.text()
    assert cause.as_json()["bound_by"][0]["cause"] == "slots"


def test_a_full_or_preempting_kv_cache_bounds_it_by_memory() -> None:
    full = sweep("kv", CURVE, [{}, {"server_kv_cache_usage_max_pct": 80.0},
                               {"server_kv_cache_usage_max_pct": 99.0, "server_requests_waiting_mean": 0.2}])
    preempting = sweep("pre", CURVE, [{}, {"server_preemptions": 0.0}, {"server_preemptions": 7.0}])
    got = by_sweep(full + preempting)
    assert [c for c, _ in got["cpu llama.cpp kv"].causes] == ["memory"]
    assert "KV cache used (max) 80 → 99 % (c=2 → c=4)" in got["cpu llama.cpp kv"].text()
    assert "preemptions 0 → 7" in got["cpu llama.cpp pre"].text()


def test_a_rising_prefill_time_bounds_it_by_compute() -> None:
    rows = sweep("pf", CURVE, [{"server_ttft_p50_ms": 10.0, "server_requests_running_max": 1.0},
                               {"server_ttft_p50_ms": 12.0, "server_requests_running_max": 2.0},
                               {"server_ttft_p50_ms": 30.0, "server_requests_running_max": 4.0}])
    (cause,) = knee_causes(rows)
    assert [c for c, _ in cause.causes] == ["compute"]
    assert ("prefill time rises (compute): server prefill p50 12 → 30 ms, requests running (max) 2 → 4 (c=2 → c=4)"
            in cause.text())
    same_batch = sweep("pf", CURVE, [{"server_ttft_p50_ms": 10.0}, {"server_ttft_p50_ms": 12.0},
                                     {"server_ttft_p50_ms": 30.0}])  # 4 running at both: not the batch's compute
    assert knee_causes(same_batch)[0].causes == []
    calm = knee_causes(sweep("pf", CURVE, [{"server_ttft_p50_ms": 10.0}] * 3))[0]
    assert calm.causes == [] and "no cause found among those judged: slots: requests running" in calm.text()
    assert "compute: server prefill p50 10 → 10 ms" in calm.text()


def test_a_busy_client_or_late_open_loop_sends_bound_it_by_the_client() -> None:
    closed = sweep("cl", CURVE, [{}, {"client_busy_pct": 70.0}, {"client_busy_pct": 97.0}])
    rates = [row(r, y, "cl", rate=r, **{**CALM, "late_send_pct": late})
             for r, y, late in ((1.0, 64.0, 0.0), (2.0, 128.0, 0.0), (4.0, 140.0, 12.0))]
    got = by_sweep(closed + rates)
    assert [c for c, _ in got["cpu llama.cpp cl"].causes] == ["client"]
    assert "its process 70 → 97 % busy (c=2 → c=4)" in got["cpu llama.cpp cl"].text()
    rate = got["cpu llama.cpp cl rate"]
    assert rate.knee.by == "rate" and rate.knee.concurrency == 2.0 and [c for c, _ in rate.causes] == ["client"]
    assert rate.text().startswith("cpu llama.cpp cl (rate sweep): knee at 2 req/s: 128 tok/s; bounded by: the "
                                  "client (its own measured cost): its process 20 → 20 % busy, late sends 0 → 12 % "
                                  "(2 req/s → 4 req/s)"), rate.text()


def test_without_the_servers_view_slots_and_memory_cannot_be_judged() -> None:
    """llama-cpp-python's server: no /metrics (0 scrapes, no server_* figures), no timings; the client measured."""
    blind = {"server": "llama-cpp-python 0.3", "server_scrapes": 0, "server_requests_running_max": None,
             "server_requests_waiting_mean": None, "server_kv_cache_usage_max_pct": None}
    (cause,) = knee_causes(sweep("blind", CURVE, [blind] * 3))
    assert cause.causes == [] and [c for c, _ in cause.unjudged] == ["slots", "memory", "compute"]
    text = cause.text()
    assert ("the queue grows at constant running requests (slots / max_num_seqs) cannot be judged: the server's own "
            "view is missing (no /metrics scraped)") in text
    assert "the KV cache is full or preempting (memory) cannot be judged: the server's own view is missing" in text
    assert "prefill time rises (compute) cannot be judged: the server reports no prefill time" in text
    assert "no cause found among those judged: client: its process 20 → 20 % busy" in text


def test_a_sweep_still_climbing_has_no_bound_yet_and_repeats_are_averaged() -> None:
    (cause,) = knee_causes(sweep("up", (100.0, 190.0, 360.0), [{}] * 3))
    assert not cause.knee.saturated and cause.causes == cause.unjudged == [] and "nothing bounds it yet" in cause.text()
    one = {"server_requests_running_max": 1.0, "server_requests_running_mean": 1.0}
    rows = sweep("rep", CURVE, [{}, one, {**one, "server_requests_waiting_mean": 1.0}])
    rows.append(row(4, 200.0, "rep", **{**CALM, **one, "server_requests_waiting_mean": 0.0}))  # a repeat at c=4
    (cause,) = knee_causes(rows)
    assert "waiting (mean) 0 → 0.5" in cause.text() and [c for c, _ in cause.causes] == ["slots"]


def test_the_ttft_split_of_llama_server_takes_its_queue_by_littles_law_and_prefill_from_its_timings() -> None:
    r = ResultRow({**CALM, "ttft_p50_ms": 100.0, "requests_per_s": 10.0, "server_requests_waiting_mean": 0.5,
                   "server_ttft_p50_ms": 30.0})
    split = ttft_split(r)
    assert split is not None and (split.queue_ms, split.prefill_ms, split.rest_ms) == (50.0, 30.0, 20.0)
    assert split.queue_from == LITTLE and "timings" in (split.prefill_from or "")
    assert split.text() == ("TTFT p50 100.0 ms = queue 50.0 (Little's law mean) + prefill 30.0 (timings p50) + rest "
                            "20.0 ms")


def test_the_ttft_split_of_vllm_uses_its_histograms_and_takes_the_queue_off_its_own_ttft() -> None:
    hist = ttft_split(ResultRow({"server": "vllm 0.32.0", "ttft_p50_ms": 40.0, "server_queue_p50_ms": 5.0,
                                 "server_prefill_p50_ms": 20.0, "server_ttft_p50_ms": 30.0}))
    assert hist is not None and (hist.queue_ms, hist.prefill_ms, hist.rest_ms) == (5.0, 20.0, 15.0)
    ttft_only = ttft_split(ResultRow({"server": "vllm 0.32.0", "ttft_p50_ms": 40.0, "server_queue_p50_ms": 5.0,
                                      "server_ttft_p50_ms": 30.0}))
    assert ttft_only is not None and (ttft_only.prefill_ms, ttft_only.rest_ms) == (25.0, 10.0)
    assert "TTFT histogram p50 less its queue" in (ttft_only.prefill_from or "")


def test_no_server_figures_give_no_split_and_figures_past_the_client_ttft_are_said() -> None:
    none = ttft_split(ResultRow({"server": "llama-cpp-python 0.3", "ttft_p50_ms": 80.0, "server_scrapes": 0}))
    assert none is not None and none.missing is not None and none.missing.startswith(NO_SPLIT)
    assert none.queue_ms is None and "no split" in none.text() and "llama-cpp-python" in none.missing
    assert ttft_split(ResultRow({"ttft_p50_ms": None})) is None
    over = ttft_split(ResultRow({**CALM, "ttft_p50_ms": 20.0, "requests_per_s": 10.0,
                                 "server_requests_waiting_mean": 0.1, "server_ttft_p50_ms": 15.0}))
    assert over is not None and over.rest_ms == 0.0 and "sum to 25.0 ms, past it" in (over.note or "")
    assert over.queue_ms == pytest.approx(10.0)

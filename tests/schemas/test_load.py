"""schemas.load: the typed view of a result's load details, the stored JSON left as it is."""
from __future__ import annotations

from schemas.load import LoadDetails


def test_the_load_part_of_stored_details_reads_typed() -> None:
    hist = {"per_decade": 50, "first_index": 0, "bounds_ms": [1.0, 1.047, 2.0, 2.089], "counts": [1, 0, 2], "count": 3,
            "sum_ms": 5.0, "min_ms": 1.0, "max_ms": 2.0}  # as farm.histogram.histogram stores one
    details = {"load": {"client": "openai", "notes": ["n"], "latency_histogram": hist, "slo_met_share": 0.97,
                        "oversaturated": True, "oversaturated_why": "behind", "api": "openai-chat"},
               "runner": "process"}
    load = LoadDetails.of(details)
    assert (load.client, load.notes, load.slo_met_share, load.oversaturated) == ("openai", ["n"], 0.97, True)
    assert load.latency_histogram["count"] == 3 and load.oversaturated_why == "behind"
    assert load.model_extra == {"api": "openai-chat"}  # a client's own entries are kept
    assert details["load"]["latency_histogram"] is hist  # the stored dict is not touched


def test_details_without_a_load_part_read_empty() -> None:
    for details in (None, {}, {"load": None}, {"runner": "docker", "kind": "edge"}):
        load = LoadDetails.of(details)
        assert load.slo_met_share is None and load.oversaturated is False and load.client is None
        assert load.latency_histogram == {} and load.notes == [] and load.token_sources is None

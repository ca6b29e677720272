"""farm.readers.rows: a results row is the same dict with typed reads; plain dicts are wrapped, not changed."""
from __future__ import annotations

import json

from farm.readers.rows import MIXED, ResultRow, as_row, as_rows
from schemas.job import JobStatus


def _plain(**kw: object) -> dict[str, object]:
    return {"job_id": "j1", "device": "cpu", "engine": "onnxruntime", "status": "succeeded", "rate": None,
            "edge_profile": None, "error": None, **kw}


def test_a_row_reads_its_fields_typed() -> None:
    row = ResultRow(_plain(rate=100, edge_profile="pi4", status=JobStatus.failed, error="boom"))
    assert (row.job_id, row.device, row.engine, row.status) == ("j1", "cpu", "onnxruntime", "failed")
    assert row.rate == 100.0 and isinstance(row.rate, float)
    assert row.is_edge and row.edge_profile == "pi4" and row.error == "boom"
    assert not row.succeeded


def test_only_a_succeeded_status_is_success() -> None:
    assert ResultRow(_plain()).succeeded
    assert not ResultRow(_plain(status=MIXED)).succeeded
    assert not ResultRow(_plain(status=JobStatus.running)).succeeded


def test_a_row_is_still_the_dict_it_was() -> None:
    plain = _plain(throughput_infer_per_s=12.5)
    row = as_row(plain)
    assert row == plain and list(row) == list(plain)
    assert json.dumps(row) == json.dumps(plain)  # what --format json prints and export writes


def test_as_rows_wraps_plain_dicts_and_keeps_rows() -> None:
    row = ResultRow(_plain(job_id="j2"))
    out = as_rows([_plain(), row])
    assert all(isinstance(r, ResultRow) for r in out)
    assert out[1] is row and [r.job_id for r in out] == ["j1", "j2"]


def test_an_llm_row_has_its_facts_typed_and_another_none() -> None:
    row = ResultRow(_plain(knobs={"n_parallel": 4}, n_threads=2, tokenizer=None, token_source="usage",
                           input_tokens="128", output_tokens="64:256", prefix_tokens=32, workload_seed=7, prompts=None))
    llm = row.llm
    assert llm is not None and llm.knobs == {"n_parallel": 4} and llm.n_threads == 2
    assert (llm.token_source, llm.input_tokens, llm.output_tokens, llm.prefix_tokens, llm.workload_seed) == \
        ("usage", "128", "64:256", 32, 7)
    assert ResultRow(_plain(knobs=None, output_tokens=None)).llm is None


def test_a_rows_protocol_is_its_column_else_its_engines_card() -> None:
    """``ResultRow.protocol``: the stored column (the job's ``JobSpec.protocol``); a row without it (by hand, an
    older export) says OpenAI where it holds LLM figures or its engine's card speaks OpenAI."""
    from farm.readers.results import llm_rows
    from farm.readers.rows import ResultRow

    assert ResultRow(protocol="openai", engine="endpoint").protocol == "openai"
    assert ResultRow(protocol="kserve", engine="llama.cpp").protocol == "kserve"
    assert ResultRow(engine="llama.cpp").protocol == "openai"
    assert ResultRow(engine="onnxruntime").protocol == "kserve"
    assert ResultRow(engine="endpoint", output_tokens_per_s=12.5).protocol == "openai"
    assert llm_rows([ResultRow(engine="onnxruntime"), ResultRow(protocol="openai", engine="endpoint")])
    assert not llm_rows([ResultRow(engine="onnxruntime", protocol="kserve")])


def test_stored_slo_goals_keep_the_models_fields() -> None:
    """``request_slo`` copies the stored goals by the keys of ``SloGoals``: the same as ``schemas.llm.Slo``'s."""
    from farm.readers.results import _SLO_KEYS, SloGoals
    from schemas.llm import Slo

    assert set(_SLO_KEYS) == set(Slo.model_fields) == set(SloGoals.__annotations__)

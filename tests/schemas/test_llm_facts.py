"""schemas.llm_facts: what an LLM job's result row stores as columns."""
from __future__ import annotations

from schemas import JobSpec, MeasurementSettings
from schemas.llm import LlmSettings
from schemas.llm_facts import LLM_FACT_COLUMNS, LlmFacts


def _spec(engine: str = "llama.cpp", knobs: dict[str, object] | None = None, llm: bool = True) -> JobSpec:
    m = MeasurementSettings(llm=LlmSettings(input_tokens="64:256", output_tokens=32, prefix_tokens=16, seed=7)
                            if llm else None)
    return JobSpec(job_id="j", request_id="r", model_sha256="a" * 64, model_format="gguf", inputs=[], device="cpu",
                   engine=engine, batch_size=1, concurrency=1, queue="farm.cpu", measurement=m,
                   knobs=knobs or {})  # type: ignore[arg-type]


def test_n_threads_follows_the_lease_unless_the_job_set_it() -> None:
    leased = LlmFacts.of(_spec(knobs={"n_ctx": 512}), 3)
    assert leased is not None and leased.knobs == {"n_ctx": 512, "n_threads": 3} and leased.n_threads == 3
    own = LlmFacts.of(_spec(knobs={"n_threads": 1}), 3)
    assert own is not None and own.n_threads == 1 and own.knobs == {"n_threads": 1}
    unknown = LlmFacts.of(_spec(), None)  # failed before its server started: the lease's count is not claimed
    assert unknown is not None and unknown.knobs == {} and unknown.n_threads is None


def test_the_workload_and_the_main_token_source_are_columns() -> None:
    f = LlmFacts.of(_spec(), 2, {"output": {"chunks": 1, "usage": 9}})
    assert f is not None and set(f.columns()) == set(LLM_FACT_COLUMNS)
    assert (f.input_tokens, f.output_tokens, f.prefix_tokens, f.workload_seed, f.prompts) == ("64:256", "32", 16, 7,
                                                                                              None)
    assert f.token_source == "usage" and f.tokenizer is None


def test_an_engine_without_threads_and_a_job_without_llm_settings() -> None:
    vllm = LlmFacts.of(_spec("vllm", {"max_num_seqs": 8}), 4)
    assert vllm is not None and vllm.knobs == {"max_num_seqs": 8} and vllm.n_threads is None
    assert LlmFacts.of(_spec("onnxruntime", llm=False), 2) is None


def test_the_server_that_ran_is_named_with_its_version() -> None:
    f = LlmFacts.of(_spec(), 2, server={"name": "llama-server", "version": "0.6.0-dev (build 0)", "binary": "/x"})
    assert f is not None and f.server == "llama-server 0.6.0-dev (build 0)" and f.columns()["server"] == f.server
    unnamed = LlmFacts.of(_spec(), 2)
    assert unnamed is not None and unnamed.server is None

"""LLM engine knobs as matrix dimensions: named per engine, typed, checked before any job runs, one job per
combination with its knobs in the spec and its own id."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from farm.errors import RequestError
from scheduler.expand import ModelRef, expand, job_count
from schemas import ProfileRequest
from schemas.knobs import parse_knob
from schemas.llm_engines import KNOBS, check_knobs
from tests.helpers import farm

GGUF = ModelRef(sha256="0" * 64, format="gguf", filename="m.gguf", inputs=())
HF = ModelRef(sha256="1" * 64, format="hf", filename="m.tar", inputs=())


def test_each_engine_names_the_issues_knobs() -> None:
    assert set(KNOBS["llama.cpp"]) == {"n_parallel", "n_ctx", "n_threads", "n_batch", "n_ubatch", "cont_batching"}
    assert {"dtype", "attn_implementation", "max_batch_tokens"} <= set(KNOBS["transformers"])
    assert set(KNOBS["vllm"]) == {"max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                                  "enable_prefix_caching", "enable_chunked_prefill", "block_size", "dtype",
                                  "kv_cache_space", "optimization_level"}


def test_values_are_typed_and_bounded() -> None:
    assert check_knobs("llama.cpp", {"n_parallel": "4", "n_ctx": 512}) == {"n_parallel": 4, "n_ctx": 512}
    assert check_knobs("vllm", {"enable_prefix_caching": "false", "gpu_memory_utilization": "0.9"}) == {
        "enable_prefix_caching": False, "gpu_memory_utilization": 0.9}
    for engine, knobs in [("llama.cpp", {"n_parallel": "1.5"}), ("llama.cpp", {"n_ctx": 0}),
                          ("transformers", {"dtype": "int3"}), ("vllm", {"gpu_memory_utilization": 2}),
                          ("vllm", {"enable_prefix_caching": "maybe"}), ("llama.cpp", {"n_batch": True})]:
        with pytest.raises(ValueError, match="is not allowed"):
            check_knobs(engine, knobs)
    assert parse_knob("n_parallel=1, 4") == ("n_parallel", ["1", "4"])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_knob("n_parallel")


def test_knobs_are_matrix_dimensions() -> None:
    request = ProfileRequest.model_validate({"model": "m.gguf", "knobs": {"n_parallel": ["1", "4"], "n_ctx": 512},
                                             "concurrency": [1, 8]})
    jobs = expand(request, "rid", GGUF).jobs
    assert len(jobs) == job_count(request, GGUF) == 4
    assert {j.engine for j in jobs} == {"llama.cpp"}  # a GGUF model's default engine
    assert sorted((j.knobs["n_parallel"], j.concurrency) for j in jobs) == [(1, 1), (1, 8), (4, 1), (4, 8)]
    assert all(j.knobs["n_ctx"] == 512 for j in jobs) and len({j.job_id for j in jobs}) == 4
    plain = expand(ProfileRequest.model_validate({"model": "m.gguf"}), "rid", GGUF).jobs
    assert plain[0].knobs == {} and plain[0].job_id not in {j.job_id for j in jobs}
    assert [j.engine for j in expand(ProfileRequest.model_validate({"model": "m"}), "rid", HF).jobs] == ["transformers"]


def test_a_knob_the_engine_does_not_have_is_a_usage_error() -> None:
    with pytest.raises(ValidationError, match="engine transformers has no knob n_parallel"):
        ProfileRequest.model_validate({"model": "m", "engines": ["transformers"], "knobs": {"n_parallel": [2]}})
    with pytest.raises(ValidationError, match="engine onnxruntime has no knobs"):
        ProfileRequest.model_validate({"model": "m.onnx", "engines": ["onnxruntime"], "knobs": {"n_ctx": [64]}})
    with pytest.raises(ValidationError, match="no LLM engine has a knob foo"):
        ProfileRequest.model_validate({"model": "m.gguf", "knobs": {"foo": [1]}})
    with pytest.raises(RequestError, match="engine llama.cpp has no knob max_num_seqs"):
        expand(ProfileRequest.model_validate({"model": "m.gguf", "knobs": {"max_num_seqs": 4}}), "rid", GGUF)


def test_farm_submit_refuses_an_unknown_knob_before_any_job(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + bytes(8))
    out = farm("submit", str(model), "--engine", "llama.cpp", "--knob", "max_num_seqs=4", check=False)
    assert out.returncode == 2 and "has no knob max_num_seqs" in out.stderr and "Traceback" not in out.stderr
    out = farm("submit", str(model), "--knob", "n_ctx", check=False)
    assert out.returncode == 2 and "NAME=VALUE" in out.stderr

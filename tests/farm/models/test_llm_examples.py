"""The tiny-llama example: both forms written, deterministic, the same tokens in llama.cpp and transformers, and
only ordinary (printable ASCII) tokens emitted."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from farm.models.info import detect_format, inspect_model
from farm.models.llm_examples import GGUF_NAME, HF_NAME, SMALL, TINY
from tests.helpers import farm
from tests.llm_servers import skip_without
from tests.llm_servers import tiny_llama as write_tiny_llama

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "  spaces\tand\nnewlines  ",
         "naïve café 東京 🙂", "def f(x): return x ** 2  # 3.14, 65536 tokens/s"]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_example_writes_both_forms_the_same_every_time(tmp_path: Path) -> None:
    a, b = write_tiny_llama(tmp_path / "a"), write_tiny_llama(tmp_path / "b")
    assert a.gguf.name == GGUF_NAME and a.hf.name == HF_NAME
    assert {p.name for p in a.hf.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                "tokenizer_config.json"}
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert detect_format(a.gguf) == "gguf" and detect_format(a.hf) == "hf"
    assert inspect_model(a.hf).sha256 == inspect_model(b.hf).sha256
    assert a.gguf.stat().st_size < 2 << 20  # sized for a 2-core CI host


def test_farm_example_model_writes_the_tiny_llama(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "probe")  # skips without the llm extra
    out = farm("example-model", str(tmp_path / "m"), "--kind", "tiny-llama")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "m" / GGUF_NAME).is_file() and (tmp_path / "m" / HF_NAME / "config.json").is_file()


@pytest.mark.llm
def test_a_larger_shape_is_written_as_asked_and_still_emits_ordinary_tokens_to_max_tokens(tmp_path: Path) -> None:
    """The ``small`` shape (the benchmarks' server-bound model): its size in both forms' metadata, the tiny's
    tokenizer, and the guard that keeps its output printable holds at 12 layers of width 256."""
    small, tiny = write_tiny_llama(tmp_path / "small", SMALL), write_tiny_llama(tmp_path / "tiny", TINY)
    skip_without("llama.cpp")
    import llama_cpp

    config = json.loads((small.hf / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (256, 12, 768)
    assert (small.hf / "tokenizer.json").read_bytes() == (tiny.hf / "tokenizer.json").read_bytes()
    assert small.gguf.stat().st_size > 10 * tiny.gguf.stat().st_size
    llm = llama_cpp.Llama(str(small.gguf), n_ctx=512, n_threads=1, seed=1, verbose=False)
    assert llm.n_embd() == 256 and llm.metadata["llama.block_count"] == "12"
    for temperature in (0.0, 1.0):
        out = llm.create_completion("The engineer asks", max_tokens=40, temperature=temperature)
        text = out["choices"][0]["text"]
        assert out["usage"]["completion_tokens"] == 40 and out["choices"][0]["finish_reason"] == "length"
        assert text and all(" " <= c <= "~" for c in text), repr(text)


@pytest.mark.llm
def test_llama_cpp_and_transformers_count_the_same_tokens(tiny_llama: Any) -> None:
    skip_without("llama.cpp")
    skip_without("transformers")
    import llama_cpp
    from transformers import AutoTokenizer

    llm = llama_cpp.Llama(str(tiny_llama.gguf), vocab_only=True, verbose=False)
    tok = AutoTokenizer.from_pretrained(str(tiny_llama.hf))
    for text in TEXTS:
        ours = llm.tokenize(text.encode(), add_bos=False, special=False)
        theirs = tok(text)["input_ids"]
        assert ours == theirs, text
        assert len(ours) > 1


@pytest.mark.llm
def test_the_model_emits_ordinary_tokens_only_and_runs_to_max_tokens(tiny_llama: Any) -> None:
    skip_without("llama.cpp")
    import llama_cpp

    llm = llama_cpp.Llama(str(tiny_llama.gguf), n_ctx=512, n_threads=1, seed=1, verbose=False)
    for temperature in (0.0, 1.0):
        out = llm.create_completion("The engineer asks", max_tokens=120, temperature=temperature)
        text = out["choices"][0]["text"]
        assert out["usage"]["completion_tokens"] == 120 and out["choices"][0]["finish_reason"] == "length"
        assert text and all(" " <= c <= "~" for c in text), repr(text)


@pytest.mark.llm
def test_both_forms_compute_the_same_function(tiny_llama: Any) -> None:
    """Greedy decoding gives the same text in llama.cpp and transformers: the GGUF's Q/K rows are permuted
    right and the weights agree."""
    skip_without("llama.cpp")
    skip_without("transformers")
    import llama_cpp
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llm = llama_cpp.Llama(str(tiny_llama.gguf), n_ctx=256, n_threads=1, verbose=False)
    tok = AutoTokenizer.from_pretrained(str(tiny_llama.hf))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama.hf))
    ids = tok("The engineer asks")["input_ids"]
    hf = tok.decode(model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0][len(ids):])
    assert llm.create_completion("The engineer asks", max_tokens=16, temperature=0)["choices"][0]["text"] == hf

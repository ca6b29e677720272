"""LLM model formats at submit: a GGUF file by its magic, a Hugging Face folder by its files, each hashed as the
store keeps it (a folder as one deterministic tar); bad input is a one-line ModelError before any job runs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from farm.artifacts import artifact_filename
from farm.errors import ModelError
from farm.models.info import inspect_model
from farm.models.llm_info import check_fits, folder_manifest
from tests.helpers import farm


def _one_line_error(path: Path, match: str) -> None:
    with pytest.raises(ModelError, match=match) as info:
        inspect_model(path)
    assert "\n" not in str(info.value)


def test_a_gguf_file_that_is_not_one_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"\x89PNG not a model")
    _one_line_error(fake, "is not a GGUF file")
    fake.write_bytes(b"GGUF\x03\x00")
    _one_line_error(fake, "truncated GGUF")
    fake.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(16))
    _one_line_error(fake, "GGUF version 9")


def test_a_folder_that_is_not_a_model_is_refused(tmp_path: Path, tiny_llama: Any) -> None:
    (tmp_path / "empty").mkdir()
    _one_line_error(tmp_path / "empty", "without config.json")
    folder = tmp_path / "hf"
    shutil.copytree(tiny_llama.hf, folder)
    (folder / "model.safetensors").unlink()
    _one_line_error(folder, "has no weights")
    shutil.copy(tiny_llama.hf / "model.safetensors", folder)
    (folder / "tokenizer.json").unlink()
    _one_line_error(folder, "has no tokenizer")
    (folder / "config.json").write_text(json.dumps({"hidden_size": 3}))
    _one_line_error(folder, "names no model_type")


def test_a_folder_is_named_by_its_manifest_whatever_its_mtimes(tmp_path: Path, tiny_llama: Any) -> None:
    """A folder's sha256 is its manifest's (each file's path, sha256 and size): a copy with new mtimes has the same,
    a changed file another."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama.hf, copy)
    (copy / "config.json").touch()  # a new mtime: the manifest does not change
    manifest = folder_manifest(copy)
    assert manifest == folder_manifest(tiny_llama.hf)
    assert inspect_model(copy).sha256 == inspect_model(tiny_llama.hf).sha256 == manifest.digest()
    assert {e.path: e.size for e in manifest.files} == {p.name: p.stat().st_size for p in tiny_llama.hf.iterdir()}
    assert artifact_filename(tiny_llama.hf) == "tiny-llama-hf"
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    assert inspect_model(copy).sha256 != manifest.digest()


def test_a_model_larger_than_the_memory_limit_is_refused(tiny_llama: Any) -> None:
    with pytest.raises(ModelError, match=r"more than the memory limit of pi \(0 MiB\)"):
        check_fits(tiny_llama.gguf, {"big": 1 << 30, "pi": 100_000})
    check_fits(tiny_llama.hf, {"big": 1 << 30})


def test_farm_submit_refuses_a_fake_gguf_in_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("just text")
    out = farm("submit", str(fake), check=False)
    assert out.returncode == 2
    assert "is not a GGUF file" in out.stderr and "Traceback" not in out.stderr

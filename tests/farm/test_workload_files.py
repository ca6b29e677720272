"""Prompt and tokenizer files travel with the request (issue 39 point 5): uploaded at submit, content-addressed like
models (``farm.workload_files`` through ``farm.artifacts.store_model``), read by a worker only from the store, never
from a path on its own disk; a tokenizer parsed only in the jail, refused on a worker without one."""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import psutil
import pytest

from farm import sandbox, workload_files
from farm.db.session import session_scope
from farm.errors import ArtifactError, LoadGenError
from farm.settings import reset_settings
from farm.store.backends import LocalStore
from schemas import MeasurementSettings
from schemas.llm import LlmSettings
from tests.fake_openai import fake_server, word_tokenizer
from tests.helpers import farm, farm_env
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.loadgen.openai.jailed_workload import JailedTokenizer, open_workload

LLM = ["--duration", "1", "--window", "0.5", "--warmup", "0.3", "--output-tokens", "4"]
JAIL = pytest.mark.skipif(sandbox.jail_unavailable() is not None, reason=str(sandbox.jail_unavailable()))


def _settings(**llm: object) -> MeasurementSettings:
    return MeasurementSettings(duration_s=1.0, warmup_s=0.2, window_s=0.5,
                               llm={"api": "openai-chat", "output_tokens": 4, **llm})


@JAIL
def test_the_files_are_uploaded_and_the_jobs_read_the_upload(tmp_path: Path) -> None:
    """Finding: prompt and tokenizer files were paths read on the worker's disk. Now the request stores their
    bytes (content-addressed), the jobs name them by sha256, and the worker reads the stored copy."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "t1 t2 t3"}\n{"prompt": "t4 t5"}\n')
    (tmp_path / "tok-folder").mkdir()
    tok = word_tokenizer(tmp_path / "tok-folder")
    env = farm_env()
    with fake_server(model="m", ttft_ms=2, itl_ms=1) as url:
        out = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "m", "--prompts",
                   str(prompts), "--tokenizer", str(tok), *LLM, "--json", env=env)
    rid = json.loads(out.stdout)["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    assert [r["status"] for r in rows] == ["succeeded"], rows
    db = next(Path(env["FARM_HOME"]).rglob("farm.db"))
    with sqlite3.connect(db) as con:
        spec = json.loads(con.execute("SELECT spec FROM requests WHERE id = ?", (rid,)).fetchone()[0])
        stored = dict(con.execute("SELECT format, sha256 FROM model_artifacts WHERE format LIKE 'llm-%'").fetchall())
    llm = spec["measurement"]["llm"]
    assert isinstance(llm["prompts"], dict) and llm["prompts"]["label"] == str(prompts)
    assert isinstance(llm["tokenizer"], dict) and llm["tokenizer"]["filename"] == "tokenizer.json"
    store = LocalStore(Path(env["FARM_HOME"]) / "store")  # the bytes are in the model store, never in the database
    assert store.path(stored["llm-prompts"]).read_bytes() == prompts.read_bytes()
    assert store.path(stored["llm-tokenizer"]).read_bytes() == (tok / "tokenizer.json").read_bytes()


def test_a_worker_never_reads_a_path_of_its_own(tmp_path: Path) -> None:
    """A job naming a path (a crafted one, or from before this change) is refused in one line; the file is not
    read."""
    prompts = tmp_path / "worker-file.jsonl"
    prompts.write_text('{"prompt": "from the worker\'s disk"}\n')
    with fake_server(model="m") as url, pytest.raises(LoadGenError, match="never reads"):
        run_load(LoadTarget(url.split("//")[1], "m"), LoadSpec.from_settings([], 1, 1, _settings(prompts=str(prompts))))


@JAIL
def test_the_tokenizer_is_parsed_in_the_jail(tmp_path: Path) -> None:
    tok = JailedTokenizer(word_tokenizer(tmp_path) / "tokenizer.json", "t")
    try:
        assert tok.count("t1 t2 t3") == 3 and tok.cut("t1 t2 t3", 2).split() == ["t1", "t2"]
        tree = [psutil.Process(tok.proc.pid), *psutil.Process(tok.proc.pid).children(recursive=True)]
        parser = next(p for p in tree if p.name() != "bwrap")
        for ns in ("net", "pid", "user", "mnt"):
            assert os.readlink(f"/proc/{parser.pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
    finally:
        tok.close()


def test_no_jail_no_tokenizer(tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that cannot jail the tokenizer refuses it (never parses it in its own process)."""
    up = workload_files.upload("tokenizer", str(word_tokenizer(tmp_path)))
    with session_scope() as s:
        workload_files.store(s, [up])
    monkeypatch.setattr(sandbox, "jail_unavailable", lambda: "bubblewrap (bwrap) is not installed")
    llm = LlmSettings(tokenizer=up.ref)
    with pytest.raises(Exception, match="the tokenizer .* in a sandbox, which this host lacks"), open_workload(llm):
        pass


def test_a_tokenizer_folder_uploads_its_tokenizer_files_only(tmp_path: Path, sqlite_url: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)  # weights: not uploaded with the tokenizer
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "vocab.txt").write_text("a\nb\n")
    up = workload_files.upload("tokenizer", str(folder))
    assert up.ref.filename.endswith("-tokenizer") and sorted(p.name for p in up.path.iterdir()) == [
        "tokenizer_config.json", "vocab.txt"]
    with session_scope() as s:
        workload_files.store(s, [up])
    with workload_files.using(up.ref) as fetched:
        assert sorted(p.name for p in fetched.iterdir()) == ["tokenizer_config.json", "vocab.txt"]


def test_a_workload_file_stays_in_the_cache_while_a_job_reads_it(tmp_path: Path, sqlite_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: a job's prompt (or trace, tokenizer) file was fetched into the worker's cache unpinned, so a small
    FARM_CACHE_MAX_BYTES could evict it while the job read it. Now it is pinned for the job's use, evicted only
    after."""
    texts = ['{"prompt": "a b c"}\n' * 200, '{"prompt": "d e f"}\n' * 200]
    ups = []
    for name, text in zip(("p.jsonl", "q.jsonl"), texts, strict=True):
        (tmp_path / name).write_text(text)
        ups.append(workload_files.upload("prompts", str(tmp_path / name)))
    with session_scope() as s:
        workload_files.store(s, ups)
    monkeypatch.setenv("FARM_CACHE_MAX_BYTES", str(len(texts[0]) + 100))  # room for one of the two
    reset_settings()
    with workload_files.using(ups[0].ref) as held:
        with pytest.raises(ArtifactError, match="running jobs use"), workload_files.using(ups[1].ref):
            pass
        assert held.read_text() == texts[0]
    with workload_files.using(ups[1].ref) as other:  # the first one no longer in use: it goes
        assert other.read_text() == texts[1]
    assert not held.exists()

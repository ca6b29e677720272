"""A real ``farm server`` process and the real CLI on a machine without database credentials: submit, status,
results, cancel through the API; a bad token is one line and exit 4; a server killed (SIGKILL) and restarted
during submits loses and doubles nothing; a large upload streams in constant memory."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import func, select

from tests.farm.server.serverproc import ServerProcess
from tests.helpers import farm


@pytest.fixture
def server_env(tokens: dict[str, str], sqlite_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FARM_API_URL"}
    env["FARM_DATABASE_URL"] = sqlite_url
    return env


def client_env(url: str, token: str, home: Path) -> dict[str, str]:
    """A submitter's environment: the API and a token, no database or broker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_API_URL=url, FARM_TOKEN=token, FARM_HOME=str(home))
    return env


def test_the_cli_uses_the_api_and_holds_no_credential(server_env: dict[str, str], tokens: dict[str, str],
                                                      example_onnx: Path, tmp_path: Path) -> None:
    with ServerProcess(server_env, tmp_path / "server.log") as server:
        alice = client_env(server.url, tokens["alice"], tmp_path / "alice")
        out = json.loads(farm("submit", str(example_onnx), "-b", "1", "-c", "1,2", "--json", env=alice).stdout)
        rid = out["request_id"]
        status = farm("status", rid[:8], "--json", env=alice)
        assert json.loads(status.stdout)["counts"] == {"queued": 2}
        listing = farm("status", env=alice).stdout
        assert rid[:8] in listing or rid in listing
        csv = farm("results", rid, "--format", "csv", env=alice).stdout
        assert csv.startswith("request_id,") and csv.count("\n") == 3
        table = farm("results", rid, env=alice).stdout
        assert "onnxruntime" in table
        # the rows, SLO and static metrics read through the API (remote.rows_of): ranking, comparing, merging
        ranked = json.loads(farm("report", rid, "--json", env=alice).stdout)
        assert ranked["request_id"] == rid and ranked["ranked"] == []
        assert [r["reason"] for r in ranked["rejected"]] == ["queued: no result"] * 2
        compared = json.loads(farm("compare", rid, rid, "--json", env=alice).stdout)
        assert [m["verdict"] for m in compared["matches"]] == ["inconclusive"] * 2
        assert all(m["a_job"] == m["b_job"] for m in compared["matches"])
        assert "onnxruntime" in farm("results", rid, "--merge-repeats", env=alice).stdout
        assert json.loads(farm("workers", "--json", env=alice).stdout) == []
        page = tmp_path / "report.html"
        farm("report", rid, "-o", str(page), env=alice)
        assert page.read_text().startswith("<!DOCTYPE html>")
        bob = client_env(server.url, tokens["bob"], tmp_path / "bob")
        refused = farm("cancel", rid, env=bob, check=False)
        assert refused.returncode == 4 and refused.stderr.count("\n") == 1, refused.stderr
        assert "only its owner or an admin may cancel" in refused.stderr
        done = json.loads(farm("cancel", rid, "--json", env=alice).stdout)
        assert done["queued_cancelled"] == 2
        bad = farm("status", env=client_env(server.url, "farm_wrong", tmp_path / "x"), check=False)
        assert bad.returncode == 4 and bad.stderr.startswith("error: the API token is unknown or revoked")
        assert bad.stderr.count("\n") == 1 and "HTTP 401" in bad.stderr
        malformed = farm("submit", str(example_onnx), "-b", "0", env=alice, check=False)
        assert malformed.returncode == 2 and "batch_sizes" in malformed.stderr and malformed.stderr.count("\n") == 1
    assert not (tmp_path / "alice" / "farm.db").exists()  # the submitter never opened a database


def test_the_cli_sends_a_folder_model_and_an_llm_requests_files(server_env: dict[str, str], tokens: dict[str, str],
                                                                tiny_llama: object, tmp_path: Path) -> None:
    """``farm submit FOLDER --prompts FILE --tokenizer FOLDER`` through the API: the folder model goes file by file,
    the prompt file and the tokenizer's own files with it, and the stored model is the one a local submit stores."""
    from farm.db.models import ModelArtifact, Request
    from farm.db.session import session_scope
    from farm.models.llm_info import folder_manifest
    from tests.fake_openai import word_tokenizer

    hf = Path(tiny_llama.hf)  # type: ignore[attr-defined]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "t1 t2 t3"}\n')
    (tmp_path / "tok").mkdir()
    tok = word_tokenizer(tmp_path / "tok")
    with ServerProcess(server_env, tmp_path / "server.log") as server:
        alice = client_env(server.url, tokens["alice"], tmp_path / "alice")
        out = farm("submit", str(hf), "-c", "1", "--prompts", str(prompts), "--tokenizer", str(tok), "--json",
                   env=alice)
        rid = json.loads(out.stdout)["request_id"]
    with session_scope() as s:
        req = s.get(Request, rid)
        assert req is not None and req.model_sha256 == folder_manifest(hf).digest()
        assert s.get(ModelArtifact, req.model_sha256).layout == "folder"  # type: ignore[union-attr]
        llm = req.spec["measurement"]["llm"]
    assert llm["prompts"]["label"] == str(prompts) and llm["tokenizer"]["filename"] == "tokenizer.json"
    assert not (tmp_path / "alice" / "farm.db").exists()


@pytest.mark.slow
def test_a_server_killed_during_submits_loses_and_doubles_nothing(server_env: dict[str, str], tokens: dict[str, str],
                                                                  example_onnx: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.cli.remote import Api
    from farm.db.models import Request, RequestOwner
    from farm.db.session import session_scope
    from farm.settings import Settings
    from schemas import ProfileRequest

    server = ServerProcess(server_env, tmp_path / "server.log").start()
    api = Api(Settings(api_url=server.url, token=tokens["alice"], api_timeout_s=10))
    request = ProfileRequest(model=str(example_onnx), batch_sizes=[1], concurrency=[1, 2])
    answers: list[dict[str, object]] = []
    errors: list[BaseException] = []

    def submitter() -> None:
        try:
            for _ in range(12):
                answers.append(api.submit(request))
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=submitter)
    try:
        thread.start()
        for _ in range(2):  # crash it twice, mid-stream, and bring it back on the same port
            while len(answers) < (3 if not server.log.read_text().count("farm server:") > 1 else 7):
                time.sleep(0.05)
            server.kill()
            time.sleep(1.0)
            server.start()
        thread.join(180)
    finally:
        server.stop()
    assert not errors, errors
    assert len(answers) == 12 and len({a["request_id"] for a in answers}) == 12
    with session_scope() as s:
        assert s.execute(select(func.count()).select_from(Request)).scalar_one() == 12
        owners = s.execute(select(RequestOwner.client_id)).scalars().all()
    assert len(owners) == 12 == len(set(owners))


@pytest.mark.slow
def test_a_large_upload_streams_in_constant_memory(server_env: dict[str, str], tokens: dict[str, str],
                                                   tmp_path: Path) -> None:
    from farm.cli.remote import Api
    from farm.settings import Settings

    big = tmp_path / "big.bin"
    size = 768 << 20
    with big.open("wb") as fh:  # not sparse: real bytes to read and send
        block = os.urandom(1 << 20)
        for _ in range(size >> 20):
            fh.write(block)
    with ServerProcess(server_env, tmp_path / "server.log") as server:
        assert server.proc is not None
        proc = psutil.Process(server.proc.pid)
        before = proc.memory_info().rss
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak.append(proc.memory_info().rss)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            sha = Api(Settings(api_url=server.url, token=tokens["alice"], api_timeout_s=60)).upload(big)
        finally:
            stop.set()
            sampler.join()
    assert len(sha) == 64
    grew = max(peak) - before
    assert grew < 64 << 20, f"the server grew by {grew >> 20} MiB receiving a {size >> 20} MiB upload"

"""Endpoint credentials named by the operator (``farm.secrets``, issue 39 point 1): a worker-side map of names to
secret sources; a request names a credential, never a variable; unknown names refused at submit in one line; the
value never stored, logged, echoed or sent by the submit-time check, and scrubbed from errors."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from farm.errors import ConfigError, CredentialError
from farm.secrets import credential_value, credentials, scrub_text, secret_values
from farm.settings import reset_settings
from tests.fake_openai import fake_server, read_log
from tests.helpers import farm, farm_env

LLM = ["--duration", "1", "--window", "0.5", "--warmup", "0.3", "--input-tokens", "8", "--output-tokens", "4"]
SECRET = "sk-worker-0123456789abcdef"


def test_the_map_and_its_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    monkeypatch.setenv("VLLM_KEY", "v-" + SECRET)
    found = credentials(f"vllm=env:VLLM_KEY, filed=file:{key_file}")
    assert sorted(found) == ["filed", "vllm"]
    monkeypatch.setenv("FARM_ENDPOINT_CREDENTIALS", json.dumps(
        {"vllm": {"env": "VLLM_KEY", "hosts": ["llm.internal:8000"]}, "filed": {"file": str(key_file)}}))
    reset_settings()
    assert credential_value("filed", "10.0.0.1:80") == SECRET
    assert credential_value("vllm", "llm.internal:8000") == "v-" + SECRET
    for name, hostport, why in (("vllm", "evil.example:8000", "may not be sent to evil.example:8000"),
                                ("nope", "llm.internal:8000", "not set up on this worker")):
        with pytest.raises(CredentialError, match=why) as err:
            credential_value(name, hostport)
        assert SECRET not in str(err.value)
    monkeypatch.delenv("VLLM_KEY")
    with pytest.raises(CredentialError, match="VLLM_KEY is not set"):
        credential_value("vllm", "llm.internal:8000")
    for bad in ("x", "a b=env:X", "k=env:", "k=secret:X", "{"):
        with pytest.raises(ConfigError, match="FARM_ENDPOINT_CREDENTIALS"):
            credentials(bad)


def test_credential_values_are_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that echoes the key in an error: what farm writes to the database is scrubbed of it."""
    monkeypatch.setenv("ANY_NAME", SECRET)
    monkeypatch.setenv("FARM_ENDPOINT_CREDENTIALS", "k=env:ANY_NAME")
    reset_settings()
    assert SECRET in secret_values()
    assert scrub_text(f"HTTP 401: bad key {SECRET}") == "HTTP 401: bad key ***"


def test_a_request_never_makes_a_worker_send_a_variable(tmp_path: Path) -> None:
    """Finding: ``--api-key-env NAME`` made the worker read NAME from its own environment and send it to any URL
    (the submit-time check sent the submitter's). Now the option is gone: refused in one line, nothing sent."""
    headers = tmp_path / "headers.jsonl"
    env = farm_env(WORKER_SECRET=SECRET)
    with fake_server(model="m", ttft_ms=2, itl_ms=1, headers_log=headers) as url:
        proc = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "m", "--api-key-env",
                    "WORKER_SECRET", *LLM, check=False, env=env)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        request_file = tmp_path / "r.yaml"
        request_file.write_text(f"endpoint: {url}\nmodel_name: m\nmeasurement:\n  llm:\n"
                                "    api: openai-chat\n    api_key_env: WORKER_SECRET\n")
        proc = farm("submit", "-f", str(request_file), check=False, env=env)
        assert proc.returncode == 2 and "api_key_env is gone" in proc.stderr, proc.stderr
    sent = read_log(headers) if headers.exists() else []
    assert not any(SECRET in (r.get("authorization") or "") for r in sent), sent


def test_a_named_credential_goes_from_the_worker_only(tmp_path: Path) -> None:
    """The operator's credential: unknown names refused at submit; the submit-time check sends no key (the server
    asks for one: it passes as reachable); the jobs send the value; the database never holds it."""
    headers = tmp_path / "headers.jsonl"
    env = farm_env(OPERATOR_KEY=SECRET, FARM_ENDPOINT_CREDENTIALS="prod-llm=env:OPERATOR_KEY")
    with fake_server(model="m", ttft_ms=2, itl_ms=1, api_key=SECRET, headers_log=headers) as url:
        proc = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "m", "--credential",
                    "other", *LLM, check=False, env=env)
        assert proc.returncode == 2 and "credential 'other' is not set up (known: prod-llm)" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not headers.read_text().strip()  # refused unsent
        out = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "m", "--credential",
                   "prod-llm", *LLM, "--json", env=env)
    rid = json.loads(out.stdout)["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    assert [r["status"] for r in rows] == ["succeeded"]
    sent = read_log(headers)
    first = sent[0]
    assert first["path"].endswith("/models") and first["authorization"] is None  # the submit-time check
    jobs = [r for r in sent if r["path"].endswith("/completions")]
    assert jobs and all(r["authorization"] == f"Bearer {SECRET}" for r in jobs)
    assert SECRET not in out.stdout + out.stderr
    for db in Path(env["FARM_HOME"]).rglob("*.db"):
        assert SECRET.encode() not in db.read_bytes()
        with sqlite3.connect(db) as con:
            specs = [row[0] for row in con.execute("SELECT spec FROM requests")]
        assert all("prod-llm" in s for s in specs)  # the name is kept, never the value

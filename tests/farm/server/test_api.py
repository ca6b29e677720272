"""farm's API in process (FastAPI's TestClient on a SQLite ledger): every call authenticated, uploads and an
idempotent submit, read scope, owner-only changes with an audit line, 401/403/404/422/429 with one-line details."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.farm.server.conftest import auth, upload


def submit(client: Any, token: str, model: Path, client_id: str | None = None, **request: Any) -> Any:
    sha = upload(client, token, model)
    body = {"client_id": client_id or str(uuid.uuid4()), "model_upload": sha,
            "request": {"model": model.name, "batch_sizes": [1], "concurrency": [1, 2], **request}}
    return client.post("/api/v1/requests", json=body, headers=auth(token))


def test_every_call_needs_a_live_token(client: Any, tokens: dict[str, str]) -> None:
    assert client.get("/api/v1/requests").status_code == 401
    bad = client.get("/api/v1/requests", headers=auth("farm_nope"))
    assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
    assert "unknown or revoked" in bad.json()["detail"] and "\n" not in bad.json()["detail"]
    assert client.get("/api/v1/whoami", headers=auth(tokens["alice"])).json()["name"] == "alice"
    from farm.db.session import session_scope
    from farm.identity import revoke_token

    with session_scope() as s:
        assert revoke_token(s, "alice")
    assert client.get("/api/v1/whoami", headers=auth(tokens["alice"])).status_code == 401
    assert client.get("/healthz").json() == {"ready": True}
    assert "/api/v1/requests" in client.get("/api/v1/openapi.json").json()["paths"]


def test_submit_is_idempotent_and_owned(client: Any, tokens: dict[str, str], example_onnx: Path) -> None:
    cid = str(uuid.uuid4())
    first = submit(client, tokens["alice"], example_onnx, cid)
    assert first.status_code == 201, first.text
    again = submit(client, tokens["alice"], example_onnx, cid)
    assert again.status_code == 200 and again.json()["existing"] is True
    assert again.json()["request_id"] == first.json()["request_id"] and again.json()["jobs"] == 2
    other = submit(client, tokens["bob"], example_onnx, cid)  # the same client id from someone else: a new request
    assert other.status_code == 201 and other.json()["request_id"] != first.json()["request_id"]
    listed = client.get("/api/v1/requests", headers=auth(tokens["carol"])).json()
    assert {r["owner"] for r in listed} == {"alice", "bob"} and len(listed) == 2
    shown = client.get(f"/api/v1/requests/{first.json()['request_id'][:8]}", headers=auth(tokens["bob"])).json()
    listed_model = {r["model"] for r in client.get("/api/v1/requests", headers=auth(tokens["bob"])).json()}
    assert listed_model == {example_onnx.name}  # as the submitter named it, not the server's upload path
    assert shown["owner"] == "alice" and shown["counts"] == {"queued": 2} and len(shown["rows"]) == 2
    from farm.db.models import AuditEntry, Job
    from farm.db.session import session_scope

    with session_scope() as s:
        actions = [(a.actor, a.action) for a in s.execute(select(AuditEntry).order_by(AuditEntry.id)).scalars()]
        held = s.execute(select(Job.enqueued_at)).scalars().all()
    assert actions.count(("alice", "request.submit")) == 1 and ("bob", "request.submit") in actions
    assert held == [None] * 4  # held for fair share, never sent in one go


def test_only_the_owner_or_an_admin_changes_a_request(client: Any, tokens: dict[str, str], example_onnx: Path) -> None:
    rid = submit(client, tokens["alice"], example_onnx).json()["request_id"]
    refused = client.post(f"/api/v1/requests/{rid}/cancel", headers=auth(tokens["bob"]))
    assert refused.status_code == 403 and "only its owner or an admin" in refused.json()["detail"]
    assert client.delete(f"/api/v1/requests/{rid}", headers=auth(tokens["carol"])).status_code == 403
    done = client.post(f"/api/v1/requests/{rid}/cancel", headers=auth(tokens["alice"]))
    assert done.status_code == 200 and done.json()["queued_cancelled"] == 2
    assert client.delete(f"/api/v1/requests/{rid}", headers=auth(tokens["root"])).json()["deleted"] is True
    assert client.get(f"/api/v1/requests/{rid}", headers=auth(tokens["alice"])).status_code == 404
    from farm.db.models import AuditEntry
    from farm.db.session import session_scope

    with session_scope() as s:
        changes = [(a.actor, a.action, a.target) for a in s.execute(select(AuditEntry)).scalars()]
    assert ("alice", "request.cancel", rid) in changes and ("root", "request.delete", rid) in changes


@pytest.mark.parametrize("scope, readers", [("all", {"alice", "bob", "carol", "root"}),
                                            ("team", {"alice", "bob", "root"}), ("own", {"alice", "root"})])
def test_read_scope_is_an_operator_setting(scope: str, readers: set[str], client: Any, tokens: dict[str, str],
                                          example_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.settings import reset_settings

    rid = submit(client, tokens["alice"], example_onnx).json()["request_id"]
    monkeypatch.setenv("FARM_READ_SCOPE", scope)
    reset_settings()
    seen = {name for name, tok in tokens.items()
            if client.get(f"/api/v1/requests/{rid}", headers=auth(tok)).status_code == 200}
    assert seen == readers
    listed = {name for name, tok in tokens.items() if client.get("/api/v1/requests", headers=auth(tok)).json()}
    assert listed == readers


def test_malformed_requests_get_422_naming_the_field(client: Any, tokens: dict[str, str], example_onnx: Path) -> None:
    bad = submit(client, tokens["alice"], example_onnx, batch_sizes=[0])
    assert bad.status_code == 422 and "request.batch_sizes" in bad.json()["detail"], bad.text
    assert bad.json()["fields"] == ["request.batch_sizes.0"] or "request.batch_sizes" in bad.json()["fields"][0]
    no_id = client.post("/api/v1/requests", json={"request": {"model": "m.onnx"}}, headers=auth(tokens["alice"]))
    assert no_id.status_code == 422 and "client_id" in no_id.json()["detail"]
    sneaky = {"client_id": str(uuid.uuid4()), "request": {"model": "/etc/passwd"}}  # a path on the server: never read
    no_upload = client.post("/api/v1/requests", json=sneaky, headers=auth(tokens["alice"]))
    assert no_upload.status_code == 422 and no_upload.json()["detail"].startswith("model_upload:")


def test_fair_share_limits_refuse_at_submit(client: Any, tokens: dict[str, str], example_onnx: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.settings import reset_settings

    monkeypatch.setenv("FARM_MAX_QUEUED_JOBS", "3")
    monkeypatch.setenv("FARM_MAX_REQUEST_JOBS", "4")
    reset_settings()
    assert submit(client, tokens["alice"], example_onnx).status_code == 201  # 2 jobs queued
    full = submit(client, tokens["alice"], example_onnx)
    assert full.status_code == 429 and "limit of 3" in full.json()["detail"]
    big = submit(client, tokens["bob"], example_onnx, concurrency=[1, 2, 3, 4, 5])
    assert big.status_code == 429 and "limit of 4 per request" in big.json()["detail"]
    monkeypatch.setenv("FARM_LIMITS_BY", "team")
    reset_settings()
    team = submit(client, tokens["bob"], example_onnx)  # alice's 2 count for team ml
    assert team.status_code == 429 and "team 'ml'" in team.json()["detail"]
    assert submit(client, tokens["carol"], example_onnx).status_code == 201


def test_results_exports_and_report(client: Any, tokens: dict[str, str], example_onnx: Path) -> None:
    rid = submit(client, tokens["alice"], example_onnx).json()["request_id"]
    res = client.get(f"/api/v1/requests/{rid}/results", headers=auth(tokens["bob"])).json()
    assert len(res["rows"]) == 2 and res["rows"][0]["status"] == "queued"
    csv = client.get(f"/api/v1/requests/{rid}/export?format=csv", headers=auth(tokens["bob"]))
    assert csv.status_code == 200 and csv.text.startswith("request_id,") and csv.text.count("\n") == 3
    pq = client.get(f"/api/v1/requests/{rid}/export?format=parquet", headers=auth(tokens["bob"]))
    assert pq.content[:4] == b"PAR1"
    page = client.get(f"/api/v1/requests/{rid}/report.html", headers=auth(tokens["bob"]))
    assert page.status_code == 200 and "<!DOCTYPE html>" in page.text


def test_an_upload_past_the_limit_is_413_and_leaves_nothing(client: Any, tokens: dict[str, str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.settings import get_settings, reset_settings

    monkeypatch.setenv("FARM_MAX_UPLOAD_BYTES", "1000")
    reset_settings()
    res = client.put("/api/v1/uploads/big.onnx", content=b"x" * 5000, headers=auth(tokens["alice"]))
    assert res.status_code == 413 and "FARM_MAX_UPLOAD_BYTES" in res.json()["detail"]
    assert not [p for p in get_settings().uploads.rglob("*") if p.is_file()]


def test_the_web_views_cancel_is_the_owners_and_same_site_only(client: Any, tokens: dict[str, str],
                                                                  example_onnx: Path) -> None:
    rid = submit(client, tokens["alice"], example_onnx).json()["request_id"]
    client.cookies.set("farm_token", tokens["bob"])
    assert client.post(f"/requests/{rid}/cancel", headers={"Origin": "http://testserver"},
                       follow_redirects=False).status_code == 403  # not bob's
    client.cookies.set("farm_token", tokens["alice"])
    evil = client.post(f"/requests/{rid}/cancel", headers={"Origin": "http://evil.example"}, follow_redirects=False)
    assert evil.status_code == 403 and "cross-site" in evil.json()["detail"]
    mine = client.post(f"/requests/{rid}/cancel", headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert mine.status_code == 303
    page = client.get(f"/requests/{rid}")
    assert page.status_code == 200 and "cancelled" in page.text and "default-src 'none'" in page.headers[
        "content-security-policy"]


def _folder(client: Any, token: str, folder: Path) -> Any:
    listing = {p.relative_to(folder).as_posix(): upload(client, token, p)
               for p in sorted(folder.rglob("*")) if p.is_file()}
    return client.post("/api/v1/folders", json={"name": folder.name, "files": listing}, headers=auth(token))


def test_a_hugging_face_folder_is_uploaded_file_by_file(client: Any, tokens: dict[str, str], tiny_llama: Any) -> None:
    """A folder model through the API: each file a streamed upload, the folder put together from their sha256s, and
    the model stored under the same id a local submit gives it (its manifest's)."""
    from farm.db.models import ModelArtifact
    from farm.db.session import session_scope
    from farm.models.llm_info import folder_manifest

    made = _folder(client, tokens["alice"], tiny_llama.hf)
    assert made.status_code == 201, made.text
    assert made.json()["files"] == len([p for p in tiny_llama.hf.rglob("*") if p.is_file()])
    again = _folder(client, tokens["alice"], tiny_llama.hf)  # a retry: the same upload, nothing doubled
    assert again.json()["upload"] == made.json()["upload"]
    body = {"client_id": str(uuid.uuid4()), "model_upload": made.json()["upload"],
            "request": {"model": str(tiny_llama.hf), "concurrency": [1]}}
    res = client.post("/api/v1/requests", json=body, headers=auth(tokens["alice"]))
    assert res.status_code == 201, res.text
    with session_scope() as s:
        art = s.get(ModelArtifact, folder_manifest(tiny_llama.hf).digest())
        assert art is not None and art.layout == "folder" and art.format == "hf"
    listed = client.get("/api/v1/requests", headers=auth(tokens["alice"])).json()
    assert [r["model"] for r in listed] == [str(tiny_llama.hf)]  # as the submitter named it


def test_an_llm_requests_prompt_and_tokenizer_files_are_uploads(client: Any, tokens: dict[str, str], tiny_llama: Any,
                                                                tmp_path: Path) -> None:
    """Prompt and tokenizer files through the API: uploaded like the model, stored by sha256, the jobs naming them
    by the submitter's paths (never the server's upload area)."""
    from farm.db.models import Job, Request
    from farm.db.session import session_scope
    from tests.fake_openai import word_tokenizer

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "t1 t2 t3"}\n{"prompt": "t4 t5"}\n')
    (tmp_path / "tok").mkdir()
    tok = word_tokenizer(tmp_path / "tok")
    llm = {"prompts": str(prompts), "tokenizer": str(tok)}
    body = {"client_id": str(uuid.uuid4()), "model_upload": upload(client, tokens["alice"], tiny_llama.gguf),
            "request": {"model": tiny_llama.gguf.name, "concurrency": [1], "measurement": {"llm": llm}},
            "workload_uploads": {"prompts": upload(client, tokens["alice"], prompts),
                                 "tokenizer": _folder(client, tokens["alice"], tok).json()["upload"]}}
    res = client.post("/api/v1/requests", json=body, headers=auth(tokens["alice"]))
    assert res.status_code == 201, res.text
    with session_scope() as s:
        spec = s.get(Request, res.json()["request_id"]).spec  # type: ignore[union-attr]
        jobs = [j.spec for j in s.query(Job).filter(Job.request_id == res.json()["request_id"])]
    for stored in [spec, *jobs]:
        files = stored["measurement"]["llm"]
        assert files["prompts"]["label"] == str(prompts) and files["tokenizer"]["label"] == str(tok)
        assert files["prompts"]["sha256"] == body["workload_uploads"]["prompts"]
    missing = {**body, "client_id": str(uuid.uuid4()), "workload_uploads": {}}
    res = client.post("/api/v1/requests", json=missing, headers=auth(tokens["alice"]))
    assert res.status_code == 422 and res.json()["detail"].startswith("workload_uploads.prompts:"), res.text
    extra = {**body, "client_id": str(uuid.uuid4()), "request": {**body["request"], "measurement": {}}}
    res = client.post("/api/v1/requests", json=extra, headers=auth(tokens["alice"]))
    assert res.status_code == 422 and "names no such file" in res.json()["detail"], res.text


@pytest.mark.parametrize(("files", "status", "says"), [
    ({"../escape.json": "0" * 64}, 422, "not a plain relative path"),
    ({"/etc/passwd": "0" * 64}, 422, "not a plain relative path"),
    ({"a//b.json": "0" * 64}, 422, "not a plain relative path"),
    ({"config.json": "0" * 64}, 404, "no upload"),
    ({}, 422, "1 to"),
])
def test_a_bad_folder_listing_is_one_line(client: Any, tokens: dict[str, str], files: dict[str, str], status: int,
                                          says: str) -> None:
    from farm.settings import get_settings

    res = client.post("/api/v1/folders", json={"name": "m", "files": files}, headers=auth(tokens["alice"]))
    assert res.status_code == status and says in res.json()["detail"] and "\n" not in res.json()["detail"], res.text
    assert not [p for p in get_settings().uploads.rglob("*") if p.name == "m"]  # nothing half-made left


def test_a_folder_listing_naming_a_folder_is_one_line(client: Any, tokens: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "config.json").write_text("{}")
    folder = _folder(client, tokens["alice"], tmp_path / "f").json()["upload"]
    res = client.post("/api/v1/folders", json={"name": "g", "files": {"a.json": folder}},
                      headers=auth(tokens["alice"]))
    assert res.status_code == 422 and "a folder's upload" in res.json()["detail"], res.text

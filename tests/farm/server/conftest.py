"""Fixtures of the API server's tests: a migrated database, identities with tokens, and an in-process client."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def tokens(sqlite_url: str) -> dict[str, str]:
    """Tokens of alice and bob (team ml), carol (team cv) and root (admin)."""
    from farm.db.session import session_scope
    from farm.identity import create_token

    with session_scope() as s:
        return {"alice": create_token(s, "alice", team="ml"), "bob": create_token(s, "bob", team="ml"),
                "carol": create_token(s, "carol", team="cv"), "root": create_token(s, "root", admin=True)}


@pytest.fixture
def client(tokens: dict[str, str]) -> Iterator[object]:
    """A TestClient of farm's app (no release thread)."""
    from fastapi.testclient import TestClient

    from farm.server.app import create_app

    with TestClient(create_app(release_jobs=False)) as c:
        yield c


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def upload(client: object, token: str, path: Path) -> str:
    """PUT the file; its upload id (sha256)."""
    with path.open("rb") as fh:
        res = client.put(f"/api/v1/uploads/{path.name}", content=fh.read(), headers=auth(token))  # type: ignore[attr-defined]
    assert res.status_code == 201, res.text
    return str(res.json()["upload"])

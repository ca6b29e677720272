"""The server's ``/models`` route as the OpenAI client reads it before a run: which models it serves, the one a job
names and its context length; and the headers every request sends."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from workers.loadgen.openai.http_once import exchange

MODELS_LIMIT = 1 << 20  # the most bytes of a /models answer read


def headers(key: str | None) -> dict[str, str]:
    """Request headers: JSON, and the bearer token ``key`` (None: none)."""
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}


@dataclass(frozen=True)
class Auth:
    """How a request to the server authenticates: the bearer ``key`` (read on the worker from the operator's
    credential, ``farm.secrets``; None: none), or ``pending``: a key the worker will send that this process does
    not hold (the submit-time check: a 401/403 then means "reachable, asks for the key")."""

    key: str | None = None
    pending: str | None = None  # the credential's name


def served_models(base_url: str, auth: Auth, timeout_s: float, authority: str | None = None
                  ) -> list[dict[str, Any]] | None:
    """The models ``GET {base_url}/models`` lists (each with its ``id``); None when the server has no such
    route (404/405), or asks for a key only the worker will send (``auth.pending``).
    ConnectionError (one line) when the server cannot be reached or refuses the key."""
    try:
        status, raw = exchange(f"{base_url}/models", headers=headers(auth.key), timeout_s=timeout_s,
                               limit=MODELS_LIMIT, authority=authority)
    except OSError as exc:
        raise ConnectionError(f"cannot reach the OpenAI API at {base_url} ({exc}); check that the server "
                              "runs and listens there") from None
    if status in (404, 405) or (status in (401, 403) and auth.pending):
        return None
    if status >= 400:
        hint = "; check the endpoint credential (--credential)" if status in (401, 403) else ""
        raise ConnectionError(f"GET {base_url}/models answered HTTP {status}{hint}")
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        raise ConnectionError(f"GET {base_url}/models answered no JSON (or more than {MODELS_LIMIT >> 10} KiB of it)"
                              ) from None
    items = data.get("data") if isinstance(data, dict) else None
    return [m for m in items if isinstance(m, dict)] if isinstance(items, list) else None


def check_model(base_url: str, model: str, auth: Auth, timeout_s: float, authority: str | None = None
                ) -> dict[str, Any]:
    """The server's entry for ``model`` in ``/models`` (empty for a server without that route);
    ConnectionError (one line) when the server does not answer or does not list ``model``."""
    models = served_models(base_url, auth, timeout_s, authority)
    if models is None:
        return {}
    entry = next((m for m in models if str(m.get("id")) == model), None)
    if entry is None:
        raise ConnectionError(f"the server at {base_url} does not serve model {model!r} (it serves: "
                              f"{', '.join(str(m.get('id'))[:80] for m in models[:20]) or 'none'}); give one of them "
                              "with --model-name")
    return entry


def context_of(entry: dict[str, Any]) -> int | None:
    """The model's context length in a ``/models`` entry: vLLM's ``max_model_len``, llama.cpp's ``meta.n_ctx_train``,
    or a ``context_length``; None when it names none."""
    found = entry.get("meta")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    for value in (entry.get("max_model_len"), entry.get("context_length"), meta.get("n_ctx_train")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None

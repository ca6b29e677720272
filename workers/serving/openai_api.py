"""A running server that speaks the OpenAI API (vLLM, SGLang, llama.cpp, TGI, Ollama, ``transformers serve``):
checked at submission (``farm submit --endpoint http://HOST:PORT --api ...``, through ``farm.endpoint``'s
``Attach``) and again by the worker before it is measured. The check reads ``GET /v1/models``: the server
answers and lists the model (a server without that route passes; the first request then says more).

Both checks connect to the address the egress policy pinned (``farm.egress``), naming the endpoint in the Host
header and TLS. At submit no key is sent, whatever the request names: a server that asks for one passes as
reachable when the request names an operator's credential (the worker sends it); on the worker the credential's
value is read from the operator's source (``farm.secrets.credential_value``) and sent as the bearer token."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.errors import ServerError
from schemas.llm import LlmSettings
from workers.loadgen.openai.models_api import Auth, check_model, context_of


@dataclass(frozen=True)
class OpenAIServer:
    """What farm knows of an OpenAI-compatible server (``farm.endpoint.ServedModel``): named ``openai-api``, its
    version what ``/models`` says owns the model (vLLM: ``vllm``, llama-cpp-python: ``me``), the API, its context
    length where ``/models`` gives it, and no tensor inputs or outputs."""

    host: str
    port: int
    server_name: str
    server_version: str
    platform: str
    inputs: Sequence[Any] = field(default_factory=tuple)
    outputs: Sequence[Any] = field(default_factory=tuple)
    context_tokens: int | None = None


def attach_openai(hostport: str, model_name: str, timeout_s: float, llm: LlmSettings, authority: str | None = None,
                  key: str | None = None) -> OpenAIServer:
    """The server at ``hostport`` (a pinned ``ADDRESS:PORT``; ``authority``: the endpoint's ``HOST:PORT``) once it
    lists ``model_name``; ``key``: the bearer token (None: none sent; a 401 then passes when the request names a
    credential). ServerError (one line) otherwise."""
    auth = Auth(key=key, pending=llm.credential if key is None else None)
    try:
        entry = check_model(llm.base_url(hostport), model_name, auth, timeout_s, authority)
    except ConnectionError as exc:
        raise ServerError(str(exc)) from None
    host, _, port = hostport.rpartition(":")
    return OpenAIServer(host=host.strip("[]"), port=int(port), server_name="openai-api",
                        server_version=str(entry.get("owned_by") or "")[:100], platform=llm.api,
                        context_tokens=context_of(entry))

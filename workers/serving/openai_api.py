"""A running server that speaks the OpenAI API (vLLM, SGLang, llama.cpp, TGI, Ollama, ``transformers serve``):
checked at submission (``farm submit --endpoint http://HOST:PORT --api ...``, through ``farm.endpoint``'s
``Attach``) and again by the worker before it is measured. The check reads ``GET /v1/models``: the server
answers and lists the model (a server without that route passes; the first request then says more)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.errors import ServerError
from schemas.llm import LlmSettings
from workers.loadgen.openai_http import check_model


@dataclass(frozen=True)
class OpenAIServer:
    """What farm knows of an OpenAI-compatible server (``farm.endpoint.ServedModel``): named ``openai-api``, its
    version what ``/models`` says owns the model (vLLM: ``vllm``, llama-cpp-python: ``me``), the API, and no
    tensor inputs or outputs."""

    host: str
    port: int
    server_name: str
    server_version: str
    platform: str
    inputs: Sequence[Any] = field(default_factory=tuple)
    outputs: Sequence[Any] = field(default_factory=tuple)


def attach_openai(hostport: str, model_name: str, timeout_s: float, llm: LlmSettings) -> OpenAIServer:
    """The server at ``hostport`` once it lists ``model_name``; ServerError (one line) otherwise."""
    try:
        entry = check_model(llm.base_url(hostport), model_name, llm.api_key_env, timeout_s)
    except ConnectionError as exc:
        raise ServerError(str(exc)) from None
    host, _, port = hostport.rpartition(":")
    return OpenAIServer(host=host.strip("[]"), port=int(port), server_name="openai-api",
                        server_version=str(entry.get("owned_by") or ""), platform=llm.api)

"""The serving engines by engine name (the keys of ``schemas.engines.RULES``): one entry per engine, farm's
built-in server for each in-process one. Runners and the job path find an engine's launch here only."""
from __future__ import annotations

from farm.errors import UnsupportedError
from schemas.engines import ENDPOINT_ENGINE, IN_PROCESS
from workers.serving.base import ServingEngine
from workers.serving.builtin import BuiltinServer
from workers.serving.endpoint import Endpoint
from workers.serving.llama_cpp import LlamaCpp
from workers.serving.transformers_serve import TransformersServe
from workers.serving.triton import Triton
from workers.serving.vllm import Vllm

SERVING: dict[str, ServingEngine] = {
    **{engine: BuiltinServer(engine) for engine in IN_PROCESS},
    "triton": Triton(),
    ENDPOINT_ENGINE: Endpoint(),
    "llama.cpp": LlamaCpp(),
    "transformers": TransformersServe(),
    "vllm": Vllm(),
}


def serving_engine(engine: str) -> ServingEngine:
    """The serving engine called ``engine``; UnsupportedError for one farm does not serve."""
    try:
        return SERVING[engine]
    except KeyError:
        raise UnsupportedError(f"engine {engine!r} is unknown; farm serves {', '.join(SERVING)}") from None

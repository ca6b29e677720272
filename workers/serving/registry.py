"""The serving engines by engine name (the keys of ``schemas.engines.CARDS``): one entry per engine, farm's
built-in server for each in-process one, else the ``ServingEngine`` of the card's ``module`` (the class whose
``name`` is the card's), so a new engine with its own server is one serving module plus its card. Runners and
the job path find an engine's launch here only."""
from __future__ import annotations

from farm.errors import UnsupportedError
from schemas.engines import CARDS, EngineCard
from workers.engines.backends import card_class
from workers.serving.base import ServingEngine
from workers.serving.builtin import BuiltinServer


def _serving(card: EngineCard) -> ServingEngine:
    return BuiltinServer(card.name) if card.in_process else card_class(card, ServingEngine, "name")()


SERVING: dict[str, ServingEngine] = {c.name: _serving(c) for c in CARDS.values()}


def serving_engine(engine: str) -> ServingEngine:
    """The serving engine called ``engine``; UnsupportedError for one farm does not serve."""
    try:
        return SERVING[engine]
    except KeyError:
        raise UnsupportedError(f"engine {engine!r} is unknown; farm serves {', '.join(SERVING)}") from None

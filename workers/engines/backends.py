"""The backends of the in-process engines (``schemas.engines.IN_PROCESS``), by engine name: each card's
``module`` holds its ``Backend`` (the class whose ``engine`` is the card's name), so a new in-process engine is
one backend module plus its card. farm's built-in server and edge runs load models through :func:`make_backend`.

The backend modules import their engine's package (torch, openvino) only when a model loads, so listing
them here costs no heavy import."""
from __future__ import annotations

import importlib
from typing import Any

from farm.errors import ServerError
from schemas.engines import CARDS, EngineCard
from workers.engines.base import Backend


def card_class(card: EngineCard, base: type, attribute: str) -> type[Any]:
    """The subclass of ``base`` in ``card.module`` whose ``attribute`` is the card's engine name; LookupError
    naming the module when it has none."""
    module = importlib.import_module(card.module)
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, base) and getattr(value, attribute, None) == card.name:
            return value
    raise LookupError(f"{card.module} has no {base.__name__} with {attribute} {card.name!r} (its engine card says so)")


BACKENDS: dict[str, type[Backend]] = {c.name: card_class(c, Backend, "engine") for c in CARDS.values() if c.in_process}
BACKEND_ENGINES: tuple[str, ...] = tuple(BACKENDS)


def make_backend(engine: str) -> Backend:
    """A fresh, unloaded backend for ``engine`` (one of :data:`BACKEND_ENGINES`)."""
    e = engine.strip().lower()
    backend = BACKENDS.get(e)
    if backend is not None:
        return backend()
    if e in CARDS:
        raise ServerError(f"engine {e!r} is served by its own server (workers.serving), not farm's built-in one; "
                          f"the built-in server runs {', '.join(BACKEND_ENGINES)}")
    raise ServerError(f"engine {engine!r} is unknown; the built-in server runs {', '.join(BACKEND_ENGINES)}")

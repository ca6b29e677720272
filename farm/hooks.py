"""Events raised in a lower layer that a higher one acts on, so that the lower one need not import it.

farm's layers (``docs`` / README: schemas <- farm core <- scheduler | workers <- CLI) forbid, for example, a
worker importing the scheduler; yet when a worker writes the result of a quick-search step, the scheduler's
``advance`` should enqueue the next step at once. The worker raises ``search_step_done`` and whoever starts the
process (the CLI: ``farm worker``, embedded ``farm submit``) registers the scheduler's handler into it.

Our own code rather than a signal library (blinker): one typed event with a handful of lines, no dependency.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("farm.hooks")


class Hook(Generic[T]):
    """Handlers called with one argument when the event happens, in registration order (what they return is
    ignored); each handler is kept once however often it is registered."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: list[Callable[[T], object]] = []

    def register(self, handler: Callable[[T], object]) -> None:
        if handler not in self._handlers:
            self._handlers.append(handler)

    def unregister(self, handler: Callable[[T], object]) -> None:
        if handler in self._handlers:
            self._handlers.remove(handler)

    @property
    def handlers(self) -> tuple[Callable[[T], object], ...]:
        return tuple(self._handlers)

    def fire(self, arg: T) -> None:
        """Call every handler with ``arg``; a handler's exception propagates (the caller decides)."""
        for handler in tuple(self._handlers):
            handler(arg)


#: a quick-search step's result was written (argument: the request id); handler: ``scheduler.search.advance``
search_step_done: Hook[str] = Hook("search_step_done")

#: a worker started a step that may take a while without output (argument: what it is doing, e.g. ``starting the
#: onnxruntime server (loading the model)``); the CLI shows it beside a spinner during embedded runs
#: (``farm.cli.live``). Nothing is registered in ``farm worker``: a handler must be cheap and never raise.
job_step: Hook[str] = Hook("job_step")


def announce(what: str) -> None:
    """Fire ``job_step`` with ``what``; a failing handler is logged, never allowed to stop the job."""
    try:
        job_step.fire(what)
    except Exception:  # a display must not fail a measurement
        log.debug("job_step handler failed", exc_info=True)

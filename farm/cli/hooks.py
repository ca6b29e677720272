"""The handlers the CLI registers at the start of a process that runs jobs (``farm worker``, embedded
``farm submit`` / ``farm resume``) for the events workers raise (``farm.hooks``): workers never import
the scheduler."""
from __future__ import annotations

from farm.hooks import search_step_done
from scheduler.search import advance


def register_hooks() -> None:
    """A quick search's next step is enqueued as soon as a step's result is written (``scheduler.search``)."""
    search_step_done.register(advance)

"""A worker's life cycle, as its row in ``workers`` records it."""
from __future__ import annotations

from enum import StrEnum


class WorkerStatus(StrEnum):
    """online (registered, heartbeating) -> offline (stopped cleanly) | lost (its heartbeat stopped; set by
    reconciliation). A worker that starts again is online. Members compare equal to their strings, so SQL
    and JSON carry the plain names. Whether an online worker is live also depends on its last heartbeat:
    ``farm.db.models.live_worker`` is that rule."""

    online = "online"
    offline = "offline"
    lost = "lost"

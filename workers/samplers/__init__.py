"""Resource samplers, each a context manager sampling in a thread at >= 10 Hz."""
from __future__ import annotations

"""Runners start a serving engine (or an edge run) for one job and always clean up after it."""
from __future__ import annotations

"""farm: a distributed profiling farm for ML model serving."""
from __future__ import annotations

__version__ = "0.1.0"

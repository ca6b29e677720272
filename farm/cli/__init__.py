"""farm's command line (Typer + Rich): the only place that imports ``scheduler`` and ``workers``."""
from __future__ import annotations

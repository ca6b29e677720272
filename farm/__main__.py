"""``python -m farm`` runs the CLI."""
from __future__ import annotations

from farm.cli.main import main

main()

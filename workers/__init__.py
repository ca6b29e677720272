"""Worker node: hardware discovery, registration, claiming, runners, engines, load generator, samplers."""
from __future__ import annotations

"""Alembic migrations for farm's database (Postgres and SQLite)."""
from __future__ import annotations

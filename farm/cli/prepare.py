"""The database check that every command reading or writing the ledger runs first (``prepare_db``); its own
module so that the command modules (``farm.cli.main``, ``cluster``, ``compare_cmd``, ``report_cmd``) share it
without importing each other."""
from __future__ import annotations

from farm.db.migrate import ensure_current, is_current
from farm.errors import ConfigError
from farm.settings import get_settings, mask_url


def prepare_db() -> None:
    """The embedded SQLite default migrates itself; other databases must be at the newest revision."""
    url = get_settings().db_url
    if url.startswith("sqlite"):
        ensure_current(url)
    elif not is_current(url):
        raise ConfigError(f"database {mask_url(url)} is not at farm's newest schema; run `farm db upgrade`")

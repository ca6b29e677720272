"""Running Alembic from code: ``farm db upgrade`` and the embedded default's automatic upgrade.

Alembic is imported inside the functions: the CLI imports this module at start (``farm.cli.prepare``), and
alembic would add 0.35-0.4 s (measured) to commands that never touch the database (``farm --help``,
``example-model``, ``analyze``, ``serve``, ``worker``)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect

from farm.db.session import get_engine
from farm.settings import get_settings

if TYPE_CHECKING:
    from alembic.config import Config

#: farm/ and migrations/ are installed side by side (a top-level ``migrations`` import may find another one)
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config pointing at farm's migrations and the given (or configured) database."""
    from alembic.config import Config  # noqa: PLC0415 - alembic: see the module docstring

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", (url or get_settings().db_url).replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database schema to ``revision``."""
    from alembic import command  # noqa: PLC0415 - alembic: see the module docstring

    cfg = alembic_config(url)
    with get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def is_current(url: str | None = None) -> bool:
    """True when the database has farm's tables at the newest revision."""
    from alembic.runtime.migration import MigrationContext  # noqa: PLC0415 - alembic: see the module docstring
    from alembic.script import ScriptDirectory  # noqa: PLC0415 - alembic: see the module docstring

    engine = get_engine(url)
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return False
        current = MigrationContext.configure(conn).get_current_heads()
    heads = ScriptDirectory.from_config(alembic_config(url)).get_heads()
    return set(current) == set(heads)


def ensure_current(url: str | None = None) -> None:
    """Upgrade when not current (the embedded default migrates its SQLite file on first use)."""
    if not is_current(url):
        upgrade(url)

"""Turning errors into one line and a non-zero exit code, never a traceback."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from farm.errors import FarmError, RequestError
from farm.settings import get_settings, mask_url


def validation_message(exc: ValidationError, prefix: str = "invalid request") -> str:
    """One line naming each bad field and what is allowed."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__") or "request"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return f"{prefix}: " + "; ".join(parts)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def run_cli(fn: Callable[[], Any]) -> None:
    """Run the Typer app, printing farm's errors as one line on stderr with their exit code."""
    try:
        fn()
    except FarmError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except ValidationError as exc:
        print(f"error: {one_line(validation_message(exc))}", file=sys.stderr)
        sys.exit(RequestError.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        from sqlalchemy.exc import OperationalError, ProgrammingError

        if isinstance(exc, (OperationalError, ProgrammingError)):
            url = mask_url(get_settings().db_url)
            detail = one_line(str(exc.orig) if getattr(exc, "orig", None) else str(exc))[:300]
            print(f"error: database {url} failed: {detail}; is it up, and did you run `farm db upgrade`?",
                  file=sys.stderr)
            sys.exit(1)
        if os.environ.get("FARM_DEBUG"):
            raise
        print(f"error: internal error: {type(exc).__name__}: {one_line(str(exc))[:300]} "
              "(set FARM_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        sys.exit(70)

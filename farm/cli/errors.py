"""Turning errors into one line and a non-zero exit code, never a traceback."""
from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import typer
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError, ProgrammingError

from farm.errors import FarmError, RequestError
from farm.formatting import printable
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
    """``text`` on one line (whitespace runs as one space), its control characters escaped (``printable``):
    an error may quote a user's name, path or stored error."""
    return printable(" ".join(str(text).split()))


USAGE_EXIT = 2
"""Exit code of a command-line usage error (Click's convention)."""
INTERRUPTED_EXIT = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""


def _click_exceptions() -> Any:
    """The module of the Click exceptions Typer raises: its bundled copy (``typer._click``) or click."""
    return importlib.import_module(typer.BadParameter.__module__)


def usage_message(exc: Any) -> str:
    """Click's own one-line message for a UsageError (with its "did you mean"), and where to read the usage."""
    text = one_line(exc.format_message())
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        text += f" (see `{ctx.command_path} --help`)"
    return text


def run_app(app: typer.Typer, args: Sequence[str] | None, prog_name: str = "farm") -> None:
    """Run a Typer app without its own error printing: usage errors are one line and exit 2, Ctrl-C
    raises KeyboardInterrupt (for ``run_cli``), every other exception propagates unchanged."""
    click_exc = _click_exceptions()
    try:
        code = app(args=list(args) if args is not None else None, prog_name=prog_name, standalone_mode=False)
    except typer.Exit as exc:  # Typer/Click versions that raise it instead of returning its code
        code = exc.exit_code
    except typer.Abort as exc:  # older Click turns Ctrl-C into Abort
        if isinstance(exc.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        sys.exit(1)
    except click_exc.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help, printed already or as the message
            help_text: str = exc.format_message()
            if help_text.strip():
                print(help_text, file=sys.stderr)
        else:
            print(f"error: {usage_message(exc)}", file=sys.stderr)
        sys.exit(USAGE_EXIT)
    except click_exc.ClickException as exc:
        print(f"error: {one_line(exc.format_message())}", file=sys.stderr)
        sys.exit(exc.exit_code)
    if code == INTERRUPTED_EXIT:  # Typer turns KeyboardInterrupt into Exit(130) and returns the code
        raise KeyboardInterrupt
    if isinstance(code, int) and not isinstance(code, bool) and code:
        sys.exit(code)


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
        sys.exit(INTERRUPTED_EXIT)
    except Exception as exc:
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

"""The FastAPI application of ``farm server``: the JSON API (``farm.server.api``), the web view
(``farm.server.web``), a readiness probe (``/healthz``), farm's errors as HTTP answers with a one-line
``detail``, and a background thread releasing held jobs (fair share) beside ``farm scheduler``'s."""
from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy import text

from farm import __version__
from farm.db.migrate import is_current
from farm.db.session import get_engine
from farm.errors import (
    ArtifactError,
    AuthError,
    ConfigError,
    FarmError,
    ForbiddenError,
    LimitError,
    NotFoundError,
    RequestError,
    SchedulerError,
    TooLargeError,
)
from farm.server import api, uploads, web
from farm.settings import get_settings
from scheduler.fairshare import release

log = logging.getLogger("farm.server")

#: farm's errors as HTTP statuses (the most specific class first); any other FarmError is a 400
STATUS: tuple[tuple[type[FarmError], int], ...] = (
    (AuthError, 401), (ForbiddenError, 403), (NotFoundError, 404), (TooLargeError, 413), (LimitError, 429),
    (RequestError, 422),
    (ArtifactError, 422), (SchedulerError, 503), (ConfigError, 503),
)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def field_errors(errors: list[dict[str, object]]) -> str:
    """Pydantic's errors as one line naming each field: ``request.batch_sizes.0: Input should be ...``."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]  # type: ignore[attr-defined]
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{'.'.join(loc) or 'body'}: {msg}")
    return "invalid request: " + "; ".join(parts)


def _farm_error(_: Request, exc: Exception) -> JSONResponse:
    code = next((c for kind, c in STATUS if isinstance(exc, kind)), 400)
    headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
    return JSONResponse({"detail": _one_line(str(exc))}, status_code=code, headers=headers)


def _invalid(_: Request, exc: Exception) -> JSONResponse:
    errors = list(exc.errors()) if isinstance(exc, RequestValidationError | ValidationError) else []
    fields = [".".join(str(p) for p in e.get("loc", ()) if p != "body") for e in errors]
    return JSONResponse({"detail": field_errors(errors), "fields": fields}, status_code=422)


class Releaser:
    """A daemon thread releasing held jobs every ``FARM_RELEASE_INTERVAL_S`` (and sweeping old uploads every 10
    minutes)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="farm-release", daemon=True)

    def _loop(self) -> None:
        settings = get_settings()
        passes = 0
        while not self.stop.wait(settings.release_interval_s):
            try:
                release(settings)
                passes += 1
                if passes % max(1, int(600 / settings.release_interval_s)) == 0:
                    uploads.sweep()
            except Exception as exc:  # the database or broker is down: the next pass tries again
                log.warning("releasing held jobs failed (%s: %s)", type(exc).__name__, _one_line(str(exc))[:200])


def create_app(release_jobs: bool = True) -> FastAPI:
    """farm's API and web view; ``release_jobs``: run the fair-share releaser thread (not in unit tests)."""
    releaser = Releaser() if release_jobs and not get_settings().embedded else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if releaser is not None:
            uploads.sweep()
            releaser.thread.start()
        yield
        if releaser is not None:
            releaser.stop.set()

    app = FastAPI(title="farm", version=__version__, lifespan=lifespan, openapi_url="/api/v1/openapi.json",
                  docs_url="/api/docs", redoc_url=None,
                  description="farm's API: submit profiling requests, read their jobs and results, cancel them. "
                              "Every call takes an HTTP Bearer token from `farm token create`.")
    app.add_exception_handler(FarmError, _farm_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(ValidationError, _invalid)

    schema_ok = threading.Event()  # once at the newest schema, a probe only pings the database (Alembic's check: 0.1 s)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> JSONResponse:
        """Readiness: the database answers and is at farm's newest schema."""
        url = get_settings().db_url
        try:
            if schema_ok.is_set():
                with get_engine(url).connect() as conn:
                    conn.execute(text("SELECT 1"))
            elif is_current(url):
                schema_ok.set()
        except Exception as exc:
            return JSONResponse({"ready": False, "detail": f"database unreachable ({type(exc).__name__})"}, 503)
        ok = schema_ok.is_set()
        return JSONResponse({"ready": ok} | ({} if ok else {"detail": "run `farm db upgrade`"}), 200 if ok else 503)

    app.include_router(api.router)
    app.include_router(web.router)
    return app

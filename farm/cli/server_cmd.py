"""Operator commands of a shared farm: ``farm server`` (the API and web view) and ``farm token`` (identities)."""
from __future__ import annotations

import typer
from rich.table import Table

from farm.cli.prepare import prepare_db
from farm.cli.views import console, err_console, safe_row, say
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.identity import create_token, identities, revoke_token
from farm.logs import setup_logging
from farm.settings import get_settings, mask_url

token_app = typer.Typer(help="API identities: tokens for submitters and CI pipelines (operators only).",
                        no_args_is_help=True)


def server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="TCP port (0: any free one, printed)."),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="Server processes (uvicorn's workers); about "
                                "one per core the server may use."),
    loglevel: str = typer.Option("INFO", "--loglevel", envvar="FARM_LOGLEVEL"),
) -> None:
    """Run farm's HTTP API and web view (OpenAPI at /api/docs): submitters use it with FARM_API_URL and
    FARM_TOKEN instead of the database and broker credentials, which only this server, the scheduler and the
    workers hold."""
    import uvicorn  # noqa: PLC0415 - the server's stack (uvicorn, FastAPI): `farm server` only

    from farm.server.app import create_app  # noqa: PLC0415 - as above

    settings = get_settings()
    setup_logging(loglevel, settings.log_format)
    prepare_db()
    broker = mask_url(settings.broker_url) if settings.broker_url else "none (requests are stored, not run: set " \
        "FARM_BROKER_URL)"
    err_console.print(f"farm server: http://{host}:{port}/ (API /api/v1, docs /api/docs); database "
                      f"{mask_url(settings.db_url)}; broker {broker}")
    options = dict(host=host, port=port, log_level=loglevel.lower(), access_log=False, timeout_graceful_shutdown=10)
    if workers > 1:  # uvicorn starts each worker process from the factory's import path
        uvicorn.run("farm.server.app:create_app", factory=True, workers=workers, **options)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(), **options)  # type: ignore[arg-type]


@token_app.command("create")
def token_create(
    name: str = typer.Argument(..., help="The identity: a person or a CI pipeline."),
    team: str | None = typer.Option(None, "--team", help="Its team (read scope `team`, team limits)."),
    admin: bool = typer.Option(False, "--admin", help="May read, cancel and delete every request."),
    priority: int = typer.Option(0, "--priority", help="0-9: its jobs are released before those of lower "
                                 "priorities (CI pipelines)."),
    max_queued: int | None = typer.Option(None, "--max-queued-jobs", min=1, help="Its own queued-jobs limit "
                                          "(default FARM_MAX_QUEUED_JOBS)."),
    max_running: int | None = typer.Option(None, "--max-running-jobs", min=0, help="Its own limit of jobs in "
                                           "flight (default FARM_MAX_RUNNING_JOBS; 0: none)."),
    max_request: int | None = typer.Option(None, "--max-request-jobs", min=0, help="Its own limit of jobs per "
                                           "request (default FARM_MAX_REQUEST_JOBS)."),
) -> None:
    """Create an identity's API token and print it once (farm keeps only its sha256)."""
    prepare_db()
    limits = {"max_queued_jobs": max_queued, "max_running_jobs": max_running, "max_request_jobs": max_request}
    with session_scope() as s:
        token = create_token(s, name, team, admin, priority, limits)
    print(token)
    say(f"token for {name}{' (admin)' if admin else ''}: shown once; the submitter sets FARM_TOKEN to it and "
        "FARM_API_URL to this farm's `farm server`", to=err_console)


@token_app.command("revoke")
def token_revoke(name: str = typer.Argument(..., help="The identity whose token stops working.")) -> None:
    """Revoke an identity's token (its requests keep their owner)."""
    prepare_db()
    with session_scope() as s:
        if not revoke_token(s, name):
            raise RequestError(f"identity {name!r} has no live token; `farm token list` shows them")
    say(f"revoked the token of {name}")


@token_app.command("list")
def token_list() -> None:
    """Every identity: team, admin, priority, limits, created and revoked."""
    prepare_db()
    table = Table(title="identities")
    for col in ("name", "team", "admin", "priority", "limits", "created", "revoked"):
        table.add_column(col)
    with session_scope() as s:
        for i in identities(s):
            limits = ", ".join(f"{k}={v}" for k, v in (("queued", i.max_queued_jobs), ("running", i.max_running_jobs),
                                                       ("request", i.max_request_jobs)) if v is not None)
            safe_row(table, i.name, i.team or "", "yes" if i.admin else "", str(i.priority), limits or "defaults",
                     f"{i.created_at:%Y-%m-%d %H:%M}", f"{i.revoked_at:%Y-%m-%d %H:%M}" if i.revoked_at else "")
    console.print(table)


def register(app: typer.Typer) -> None:
    """Attach ``farm server`` and ``farm token`` to the CLI."""
    app.command()(server)
    app.add_typer(token_app, name="token")

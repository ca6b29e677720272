"""The CLI in a shared farm: with ``FARM_API_URL`` (and ``FARM_TOKEN``) set, ``farm submit``, ``status``,
``results``, ``cancel``, ``report`` and ``compare`` call ``farm server`` instead of the database and broker, so a
submitter's machine holds no credential but its token. The tables are drawn by the same code as on the database
(the API returns the readers' rows, ``farm.server.serialize``).

A submit streams the model (a file, or a folder file by file), the input data file and an LLM workload's prompt,
trace and tokenizer files in chunks (constant memory whatever their size) and is idempotent: it makes up one
``client_id`` and repeats the call with it until the server answers, through restarts, so nothing is lost and
nothing is doubled. Every answer that is not a success is one line: 401 (token), 403 (not yours), 404, 422
(naming the field), 429 (a fair-share limit)."""
from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import workload_files
from farm.cli import output, views
from farm.cli.followups import next_hint, results_hints
from farm.cli.views import console, err_console
from farm.errors import (
    AuthError,
    ConfigError,
    FarmError,
    ForbiddenError,
    LimitError,
    NotFoundError,
    RequestError,
)
from farm.readers.results import merge_repeats, slo_of
from farm.readers.rows import ResultRow, as_rows
from farm.settings import Settings, get_settings
from farm.store.base import is_reference
from schemas import ProfileRequest
from schemas.job import FINAL
from schemas.llm import Slo

if TYPE_CHECKING:
    import httpx

#: HTTP statuses as farm's errors (the CLI prints them as one line, with the error's exit code)
ERRORS: dict[int, type[FarmError]] = {401: AuthError, 403: ForbiddenError, 404: NotFoundError, 409: RequestError,
                                      413: LimitError, 422: RequestError, 429: LimitError}
#: statuses and failures after which a submit is tried again with the same client id (a restarting server)
RETRY_STATUS = {502, 503, 504}
CHUNK = 1 << 20  # bytes per upload chunk


class Api:
    """A client of ``farm server`` (``FARM_API_URL``, Bearer ``FARM_TOKEN``)."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or get_settings()
        self.url = (settings.api_url or "").rstrip("/")
        token = settings.token.get_secret_value() if settings.token else ""
        if not token:
            raise AuthError("FARM_API_URL is set but FARM_TOKEN is not: set it to the token `farm token create` "
                            "printed for you")
        import httpx  # noqa: PLC0415 - +0.16 s on every CLI start, measured; only a shared farm's CLI calls the API

        self.errors = httpx.HTTPError
        self.retry_s = max(settings.api_timeout_s, 30.0)
        self.http = httpx.Client(base_url=self.url + "/api/v1", timeout=settings.api_timeout_s,
                                 headers={"Authorization": f"Bearer {token}", "User-Agent": "farm-cli"})

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One call; farm's error (one line) for an answer that is not a success."""
        try:
            res = self.http.request(method, path, **kw)
        except self.errors as exc:
            raise ConfigError(f"farm's API at {self.url} did not answer ({type(exc).__name__}); is `farm server` "
                              "running, and FARM_API_URL right?") from None
        if res.is_success:
            return res
        try:
            detail = str(res.json().get("detail"))
        except ValueError:
            detail = res.text[:200]
        raise ERRORS.get(res.status_code, ConfigError)(f"{detail} (HTTP {res.status_code} from {self.url})")

    def json(self, method: str, path: str, **kw: Any) -> Any:
        return self.call(method, path, **kw).json()

    def upload(self, path: Path) -> str:
        """Stream the file at ``path`` to the server (a folder: each of its files, then its listing); its upload
        id (a file's sha256, a folder's listing's)."""
        if path.is_dir():
            return self._upload_folder(path)
        if not path.is_file():
            raise RequestError(f"{path}: no such file or folder")
        return self._upload_file(path)

    def _upload_file(self, path: Path) -> str:
        def chunks() -> Iterator[bytes]:
            with path.open("rb") as fh:
                while block := fh.read(CHUNK):
                    yield block

        return str(self.json("PUT", f"/uploads/{path.name}", content=chunks())["upload"])

    def _upload_folder(self, folder: Path) -> str:
        """Each file of ``folder`` (links inside it followed, as a local submit hashes them), then the folder."""
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        if not files:
            raise RequestError(f"{folder} is an empty folder; give a model file or a Hugging Face model folder")
        for p in files:
            if not p.resolve().is_relative_to(folder.resolve()):
                raise RequestError(f"{p} links outside the folder; copy the file into the folder")
        listing = {p.relative_to(folder).as_posix(): self._upload_file(p) for p in files}
        return str(self.json("POST", "/folders", json={"name": folder.name, "files": listing})["upload"])

    def submit(self, request: ProfileRequest) -> dict[str, Any]:
        """Upload the request's files and submit it, trying again with the same client id while the server
        restarts or does not answer (``retry_s``), and uploading again if the server lost an upload."""
        client_id = str(uuid.uuid4())
        deadline = time.monotonic() + self.retry_s
        while True:
            try:
                return self._submit_once(request, client_id)
            except (ConfigError, NotFoundError) as exc:
                retry = isinstance(exc, NotFoundError) and "upload" in str(exc)
                retry = retry or (isinstance(exc, ConfigError) and ("did not answer" in str(exc) or any(
                    f"HTTP {s}" in str(exc) for s in RETRY_STATUS)))
                if not retry or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _submit_once(self, request: ProfileRequest, client_id: str) -> dict[str, Any]:
        body: dict[str, Any] = {"client_id": client_id}
        # only what the submitter set: a default left unset stays unset on the server (an engine chosen there by the
        # model's format, as a local submit chooses it: ``scheduler.expand.request_engines``)
        data = request.model_dump(mode="json", exclude_none=True, exclude_unset=True)
        if request.model is not None and not is_reference(request.model):  # a reference: the server resolves it
            model = Path(request.model).expanduser()
            body["model_upload"] = self.upload(model)
            data["model"] = model.name
        if request.input_data is not None and request.input_data.kind == "file" and request.input_data.source:
            source = Path(request.input_data.source).expanduser()
            body["input_data_upload"] = self.upload(source)
            data["input_data"] = {**data["input_data"], "source": source.name}
        llm = request.measurement.llm
        if llm is not None:  # each file checked and chosen as a local submit would (a tokenizer's own files)
            named = {kind: workload_files.upload(kind, v).path for kind, v in llm.files().items() if isinstance(v, str)}
            body["workload_uploads"] = {kind: self.upload(path) for kind, path in named.items()}
        body["request"] = data
        out: dict[str, Any] = self.json("POST", "/requests", json=body)
        return out


def _times(raw: dict[str, Any]) -> dict[str, tuple[datetime | None, datetime | None]]:
    def parse(v: str | None) -> datetime | None:
        return datetime.fromisoformat(v) if v else None

    return {j: (parse(t.get("started_at")), parse(t.get("finished_at"))) for j, t in raw.items()}


def submit(request: ProfileRequest, wait: bool, as_json: bool) -> None:
    """``farm submit`` through the API."""
    api = Api()
    out = api.submit(request)
    rid = out["request_id"]
    if not as_json:
        left = len(out["excluded"])
        err_console.print(f"request [bold]{rid}[/]: {out['jobs']} jobs" + (f", {left} combinations left out"
                                                                          if left else "")
                          + (" (submitted before)" if out["existing"] else ""))
    if wait:
        _wait(api, rid, as_json)
        results([rid], "json" if as_json else "table", None, False, None, False)
        return
    if as_json:
        print(json.dumps({"request_id": rid}))
        return
    console.print(f"queued on {api.url}")
    next_hint(f"farm status {rid[:8]} to follow", f"farm results {rid[:8]} when done")


def _wait(api: Api, rid: str, quiet: bool, poll_s: float = 2.0) -> None:
    """Poll the request until every job is final, with one status line as counts change."""
    last = ""
    while True:
        counts: dict[str, int] = api.json("GET", f"/requests/{rid}")["counts"]
        line = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        if line != last and not quiet:
            views.say(f"request {rid[:8]}: {line}", to=err_console)
            last = line
        if sum(counts.get(s, 0) for s in FINAL) >= sum(counts.values()):
            return
        time.sleep(poll_s)


def status(request_id: str | None, as_json: bool) -> None:
    """``farm status`` through the API."""
    api = Api()
    if request_id is None:
        reqs = api.json("GET", "/requests")
        for r in reqs:
            r["created_at"] = datetime.fromisoformat(r["created_at"])
        if as_json:
            print(views.to_json(reqs))
            return
        console.print(views.requests_table(reqs))
        return
    out = api.json("GET", f"/requests/{request_id}")
    if as_json:
        print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
        return
    counts = " ".join(f"{k}={v}" for k, v in sorted(out["counts"].items()))
    title = f"request {out['request_id']} (owner {out['owner'] or 'operator'}): {counts}"
    console.print(views.status_table(out["rows"], _times(out["times"]), title=title))
    for queue, n in out["waiting"].items():
        views.say(f"{n} job(s) wait in queue {queue}: no live worker consumes it", style="yellow")
    for line in views.error_lines(out["rows"]):
        views.say(line, style="red")


@dataclass(frozen=True)
class RemoteResults:
    """A request's results as farm's API sends them (``GET /requests/ID/results``): its full id, its result rows,
    the latency goals it was submitted with (None: none) and its model's static metrics."""

    request_id: str
    rows: list[ResultRow]
    slo: Slo | None
    static: dict[str, Any]


def rows_of(api: Api, request_id: str) -> RemoteResults:
    """The request's id, result rows, SLO and static metrics from the API."""
    out = api.json("GET", f"/requests/{request_id}/results")
    return RemoteResults(out["request_id"], as_rows(out["rows"]), slo_of(out["slo"]), out["static"])


def results(request_ids: list[str], fmt: str, path: Path | None, wide: bool, metrics: tuple[str, ...] | None,
            merge: bool) -> None:
    """``farm results`` through the API: the table drawn here, exports made by the server."""
    api = Api()
    if fmt != "table" and not merge:
        data = api.call("GET", f"/requests/{request_ids[0]}/export", params={"format": fmt}).content
        if path is not None:
            path.write_bytes(data)
        else:
            sys.stdout.write(data.decode())
        return
    got = [rows_of(api, r) for r in request_ids]
    rows = [row for g in got for row in g.rows]
    if merge or any(r["repeat"] for r in rows):
        rows = merge_repeats(rows, center="declared" if merge else "median")
    title = f"request {got[0].request_id}" + (f" merged with {', '.join(g.request_id for g in got[1:])}"
                                                 if len(got) > 1 else "")
    if fmt != "table":
        text = views.to_json(rows)
        path.write_text(text) if path is not None else print(text)
        return
    output.print_table(console, rows, title, metrics, wide)
    next_hint(*results_hints(got[0].request_id))


def cancel(request_id: str, as_json: bool) -> None:
    """``farm cancel`` through the API (the owner or an admin)."""
    out = Api().json("POST", f"/requests/{request_id}/cancel")
    out.pop("running_ids", None)
    if as_json:
        print(json.dumps(out))
        return
    console.print(f"request {out['request_id']}: {out['queued_cancelled']} queued job(s) cancelled, "
                  f"{out['running_cancelled']} running job(s) stopped")


def report_html(request_id: str, path: Path, objective: str | None, stable: bool) -> None:
    """``farm report -o report.html`` through the API: the server renders it."""
    params: dict[str, Any] = {"stable": stable} | ({"objective": objective} if objective else {})
    path.write_bytes(Api().call("GET", f"/requests/{request_id}/report.html", params=params).content)
    views.say(f"wrote {path}")


def worker_rows() -> list[dict[str, Any]]:
    """``farm workers``' rows from the API (heartbeats as datetimes again)."""
    rows: list[dict[str, Any]] = Api().json("GET", "/workers")
    for r in rows:
        r["last_heartbeat"] = datetime.fromisoformat(r["last_heartbeat"])
    return rows

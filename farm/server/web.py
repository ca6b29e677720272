"""The web view of ``farm server``: the requests with their progress, a request's results table and the report's
plots, and two requests compared. Server-rendered HTML without any script (a Content-Security-Policy forbids
them and every fetch), so it works with a keyboard and a screen reader as plain HTML does: landmarks (banner,
navigation, main), a skip link first in the focus order, captions and column headers on tables, labelled
form fields and progress bars, a visible focus ring.

A browser signs in with its API token (``/login``), kept in an HttpOnly, SameSite=Strict cookie; the view is
read-only for everyone but a request's owner and admins, who get a Cancel button (a POST checked for its origin,
and again by ``farm.identity.check_write``)."""
from __future__ import annotations

import html
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from farm.db.session import session_scope
from farm.errors import AuthError, FarmError, ForbiddenError
from farm.formatting import fmt_value, rate_text
from farm.identity import Principal, authenticate, owner_of
from farm.readers.compare import as_json as comparison_json
from farm.readers.compare import compare
from farm.readers.report import build_report
from farm.readers.results import result_rows
from farm.readers.rows import ResultRow
from farm.server import access
from farm.server.api import cancel_owned, export_response
from schemas.job import FINAL
from schemas.metrics import BY_NAME

router = APIRouter(include_in_schema=False)
COOKIE = "farm_token"
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
CSS = """body{font-family:sans-serif;margin:0;color:#1a1a1a;font-size:15px}header,main,footer{padding:.5em 1.5em}
header{background:#1f3a5f;color:#fff}header a{color:#fff}
nav ul{list-style:none;padding:0;margin:0;display:flex;gap:1.5em}
.skip{position:absolute;left:-999px}.skip:focus{left:1em;top:.5em;background:#fff;color:#000;padding:.3em;z-index:9}
a:focus-visible,button:focus-visible,input:focus-visible,select:focus-visible,main:focus-visible{outline:3px solid
#e07b00;outline-offset:2px}table{border-collapse:collapse;font-size:13px;margin:.5em 0}caption{text-align:left;
font-weight:bold;padding:.3em 0}td,th{border:1px solid #bbb;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#eef}td.l,th.l{text-align:left}progress{width:9em}.bad{color:#a00}label{margin-right:.4em}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}button{font-size:14px}"""
HEADLINE = ("throughput_infer_per_s", "latency_p50_ms", "latency_p99_ms", "output_tokens_per_s", "ttft_p99_ms",
            "cpu_pct_avg", "stable")


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def viewer(request: Request) -> Principal | None:
    """The browser's identity from its cookie; None when it has none that authenticates."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        with session_scope() as s:
            return authenticate(s, token)
    except AuthError:
        return None


Viewer = Annotated[Principal | None, Depends(viewer)]


def page(title: str, body: str, who: Principal | None, status: int = 200) -> HTMLResponse:
    """One page: skip link, banner with navigation, main landmark, no script."""
    nav = ('<nav aria-label="Main"><ul><li><a href="/">Requests</a></li><li><a href="/compare">Compare</a></li>'
           + (f'<li>signed in as {_e(who.name)}</li><li><form method="post" action="/logout">'
              '<button type="submit">Sign out</button></form></li>' if who else '<li><a href="/login">Sign in</a></li>')
           + "</ul></nav>")
    doc = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)} · farm</title>'
           f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head><body>'
           '<a class="skip" href="#main">Skip to main content</a>'
           f'<header><p><b>farm</b> · profiling farm</p>{nav}</header>'
           f'<main id="main" tabindex="-1"><h1>{_e(title)}</h1>{body}</main></body></html>')
    return HTMLResponse(doc, status_code=status, headers={"Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
                                                          "Referrer-Policy": "no-referrer"})


def _signin() -> RedirectResponse:
    return RedirectResponse("/login", status_code=303)


@router.get("/login")
def login_form(who: Viewer, error: str | None = None) -> HTMLResponse:
    msg = f'<p class="bad" role="alert">{_e(error)}</p>' if error else ""
    body = (f'{msg}<form method="post" action="/login"><p><label for="token">API token</label>'
            '<input id="token" name="token" type="password" autocomplete="current-password" required '
            'aria-describedby="token-help"></p><p id="token-help">The token your operator gave you '
            '(<code>farm token create</code>); it is kept in this browser as a cookie.</p>'
            '<p><button type="submit">Sign in</button></p></form>')
    return page("Sign in", body, who)


@router.post("/login")
def login(token: Annotated[str, Form()]) -> Response:
    try:
        with session_scope() as s:
            authenticate(s, token)
    except AuthError as exc:
        return page("Sign in", f'<p class="bad" role="alert">{_e(exc)}</p><p><a href="/login">Try again</a></p>',
                    None, status=401)
    out = RedirectResponse("/", status_code=303)
    out.set_cookie(COOKIE, token, httponly=True, samesite="strict", max_age=12 * 3600)
    return out


@router.post("/logout")
def logout(request: Request) -> Response:
    _same_origin(request)
    out = RedirectResponse("/login", status_code=303)
    out.delete_cookie(COOKIE)
    return out


def _progress(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    done = sum(counts.get(s, 0) for s in FINAL)
    label = f"{done} of {total} jobs done"
    return f'<progress value="{done}" max="{max(total, 1)}" aria-label="{_e(label)}"></progress> {_e(label)}'


@router.get("/")
def requests_page(who: Viewer) -> Response:
    if who is None:
        return _signin()
    reqs = access.recent(who, 50)
    rows = "".join(
        f'<tr><td class="l"><a href="/requests/{_e(r["request_id"])}">{_e(r["request_id"][:8])}</a></td>'
        f'<td class="l">{_e(r["name"] or "")}</td><td class="l">{_e(r["model"])}</td>'
        f'<td class="l">{_e(r["owner"] or "operator")}</td><td class="l">{r["created_at"]:%Y-%m-%d %H:%M}</td>'
        f'<td class="l">{_progress(r["counts"])}</td>'
        f'<td class="l">{_e(" ".join(f"{k}={v}" for k, v in sorted(r["counts"].items())))}</td></tr>' for r in reqs)
    head = "".join(f'<th scope="col" class="l">{h}</th>' for h in ("request", "name", "model", "owner", "submitted",
                                                                    "progress", "jobs"))
    table = (f'<table id="requests"><caption>The {len(reqs)} newest requests you may read</caption><thead><tr>{head}'
             f'</tr></thead><tbody>{rows}</tbody></table>' if reqs else "<p>No request yet.</p>")
    return page("Requests", table, who)


def _config(r: ResultRow) -> str:
    edge = f" edge {r['edge_profile']}" if r.get("edge_profile") else ""
    return f"{r['device']} {r['engine']} b{r['batch_size']}×c{r['concurrency']}{rate_text(r)}{edge}"


def results_table(rows: list[ResultRow], caption: str) -> str:
    """The request's results: one row per job, the headline metrics some job measured."""
    shown = [m for m in HEADLINE if any(r.get(m) is not None for r in rows)]
    head = ('<th scope="col" class="l">job</th><th scope="col" class="l">configuration</th>'
            '<th scope="col" class="l">status</th>'
            + "".join(f'<th scope="col" title="{_e(BY_NAME[m].title)}">{_e(BY_NAME[m].label)}</th>' for m in shown))
    body = "".join(f'<tr data-job="{_e(r["job_id"])}"><th scope="row" class="l"><code>{_e(r["job_id"][:6])}</code></th>'
                   f'<td class="l">{_e(_config(r))}</td><td class="l">{_e(r["status"])}'
                   + (f' <span class="bad">{_e(str(r["error"])[:120])}</span>' if r.get("error") else "") + "</td>"
                   + "".join(f"<td>{_e(fmt_value(m, r.get(m)))}</td>" for m in shown) + "</tr>" for r in rows)
    return (f'<table id="results"><caption>{_e(caption)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


@router.get("/requests/{ref}")
def request_page(ref: str, who: Viewer) -> Response:
    if who is None:
        return _signin()
    from farm.readers.report_html import plot_figures  # noqa: PLC0415 - matplotlib: +1.2 s at start, measured

    req = access.resolve(who, ref)
    rows = result_rows(req.id)
    with session_scope() as s:
        owner = owner_of(s, req.id)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    writable = who.admin or (owner is not None and owner.owner == who.name)
    active = any(r.status not in FINAL for r in rows)
    cancel = (f'<form method="post" action="/requests/{_e(req.id)}/cancel"><button type="submit">Cancel this '
              "request</button></form>" if writable and active else "")
    mode = "" if writable else '<p id="read-only">Read-only: you do not own this request.</p>'
    rep = build_report(rows)
    figures = "".join(f'<figure id="plot-{fid}" role="group" aria-labelledby="cap-{fid}"><figcaption id="cap-{fid}">'
                      f'{_e(fid.replace("-", " "))}</figcaption>{svg}</figure>'
                      for fid, svg in plot_figures(rows, rep, None) if svg)
    body = (f'<p>request <code>{_e(req.id)}</code>{" (" + _e(req.name) + ")" if req.name else ""}, owner '
            f'{_e(owner.owner if owner else "operator")}, model <code>{_e(req.model_sha256[:12])}</code></p>'
            f"<p>{_progress(counts)}</p>{mode}{cancel}"
            f'<p><a href="/requests/{_e(req.id)}/export.csv">Download the results as CSV</a> · '
            f'<a href="/requests/{_e(req.id)}/report">The full report</a></p>'
            f"<h2>Results</h2>{results_table(rows, f'Results of request {req.id[:8]}: one row per job')}"
            f"<h2>Plots</h2>{figures or '<p>No plot yet: no job has finished.</p>'}")
    return page(f"Request {req.id[:8]}", body, who)


@router.get("/requests/{ref}/report")
def report_page(ref: str, who: Viewer) -> Response:
    if who is None:
        return _signin()
    from farm.readers.report_html import render  # noqa: PLC0415 - as in request_page

    return HTMLResponse(render(access.resolve(who, ref).id))


@router.get("/requests/{ref}/export.csv")
def export_page(ref: str, who: Viewer) -> Response:
    if who is None:
        return _signin()
    return export_response(access.resolve(who, ref).id, "csv")


def _same_origin(request: Request) -> None:
    """A form POST from another site is refused (the cookie is SameSite=Strict as well)."""
    origin = request.headers.get("origin")  # compared by host: a TLS proxy in front changes the scheme, not the host
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise ForbiddenError("cross-site form refused")


@router.post("/requests/{ref}/cancel")
def cancel_page(ref: str, request: Request, who: Viewer) -> Response:
    if who is None:
        return _signin()
    _same_origin(request)
    request_id, _ = cancel_owned(who, ref)
    return RedirectResponse(f"/requests/{request_id}", status_code=303)


def _compare_form(a: str, b: str) -> str:
    return ('<form method="get" action="/compare"><p><label for="a">Baseline request (A)</label>'
            f'<input id="a" name="a" value="{_e(a)}" required> <label for="b">Compared request (B)</label>'
            f'<input id="b" name="b" value="{_e(b)}" required> <button type="submit">Compare</button></p></form>')


@router.get("/compare")
def compare_page(who: Viewer, a: Annotated[str, Query()] = "", b: Annotated[str, Query()] = "") -> Response:
    if who is None:
        return _signin()
    body = _compare_form(a, b)
    if a and b:
        try:
            ra, rb = access.resolve(who, a), access.resolve(who, b)
        except FarmError as exc:
            return page("Compare", body + f'<p class="bad" role="alert">{_e(exc)}</p>', who, status=404)
        body += comparison_table(comparison_json(compare(result_rows(ra.id), result_rows(rb.id)), ra.id, rb.id))
    return page("Compare two requests", body, who)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def comparison_table(c: dict[str, Any]) -> str:
    """``farm compare``'s matches: coordinates, ratios B / A, verdict and why."""
    labels: list[str] = list(c["matches"][0]["ratios"]) if c["matches"] else []
    head = ('<th scope="col" class="l">configuration</th>'
            + "".join(f'<th scope="col">{_e(lb)} B/A</th>' for lb in labels)
            + '<th scope="col" class="l">verdict</th><th scope="col" class="l">why</th>')
    rows = "".join(
        '<tr><th scope="row" class="l">' + _e(" ".join(f"{k}={v}" for k, v in m["key"].items() if v is not None))
        + "</th>" + "".join(f"<td>{_ratio(m['ratios'][lb])}</td>" for lb in labels)
        + f'<td class="l">{_e(m["verdict"])}</td><td class="l">{_e(m["reason"])}</td></tr>' for m in c["matches"])
    only = (f"<p>{len(c['only_in_a'])} configuration(s) only in A, {len(c['only_in_b'])} only in B.</p>"
            if c["only_in_a"] or c["only_in_b"] else "")
    return (f'<table id="comparison"><caption>Request {_e(c["b"][:8])} compared with {_e(c["a"][:8])}'
            f"</caption><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{only}")


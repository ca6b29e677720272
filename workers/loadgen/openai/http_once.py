"""One bounded HTTP exchange with an OpenAI server outside the measured load: the model check (``GET /models``), the
Prometheus scrape and readiness polls. The connection goes to the address in the URL (an endpoint's: the one the
egress policy pinned, ``farm.egress``), while ``authority`` (the name the request gave) is sent as ``Host`` and
checked by TLS; the answer is read up to ``limit`` bytes, never more. ``http.client`` rather than urllib: urllib
takes TLS's name and the Host header from the URL, so a pinned address would fail the certificate check."""
from __future__ import annotations

import http.client
import ssl
from urllib.parse import urlsplit

from farm.egress import split_hostport

DEFAULT_LIMIT = 1 << 20  # the most bytes of an answer read, unless the caller says otherwise


class _PinnedHttps(http.client.HTTPSConnection):
    """HTTPS to the URL's address, the certificate checked against ``tls_name``."""

    def __init__(self, host: str, port: int, timeout: float, tls_name: str) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.tls_name = tls_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.tls_name)  # type: ignore[attr-defined]


def exchange(url: str, *, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None,
             timeout_s: float = 10.0, limit: int = DEFAULT_LIMIT, authority: str | None = None) -> tuple[int, bytes]:
    """``method`` ``url`` with ``headers`` (``authority``: the Host header and TLS name, ``HOST:PORT``; None: the
    URL's); the status and at most ``limit`` bytes of the body. OSError when it cannot connect or the exchange
    fails (ssl and HTTP errors included)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise OSError(f"not an http(s) URL: {url}")
    port = u.port or (443 if u.scheme == "https" else 80)
    host_header = authority or u.netloc.rsplit("@", 1)[-1]
    tls_name = split_hostport(host_header)[0]
    conn: http.client.HTTPConnection = (_PinnedHttps(u.hostname, port, timeout_s, tls_name) if u.scheme == "https"
                                        else http.client.HTTPConnection(u.hostname, port, timeout=timeout_s))
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    try:
        conn.request(method, path, body=body, headers={"Host": host_header, "Accept-Encoding": "identity",
                                                       "User-Agent": "farm", **(headers or {})})
        resp = conn.getresponse()
        return int(resp.status), resp.read(limit)
    except (TimeoutError, http.client.HTTPException, ssl.SSLError) as exc:
        raise OSError(f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.close()

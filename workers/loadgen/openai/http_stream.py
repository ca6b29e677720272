"""A minimal HTTP/1.1 streaming client on an asyncio Protocol: the transport of farm's OpenAI load loop
(``openai_http``). Each read of a connection is stamped with ``time.monotonic()`` at the entry of the
protocol's ``data_received`` callback, de-chunked there and kept as (arrival time, body bytes); the task that
sent the request wakes once, when the response has ended. Parsing the server-sent events waits for the end of
the run (``llm_stream.replay``).

Why our own code and not aiohttp (which this loop ran on before): aiohttp hands each read to a task through
its StreamReader, so the stamp is taken when that task runs, after every other connection's read of the same
event-loop turn has been parsed and its task woken; at 256 streams that queue put milliseconds between a
token's arrival and its stamp, and cost a task wake-up per chunk. aiohttp's protocol (``ResponseHandler``)
could be subclassed, but only through private attributes (the connector's ``_factory``, the handler's
``_payload``) that move between releases, and its reader would still wake the task per chunk. What farm needs
is narrow: POST a JSON body to one server and read one response at a time per connection: status line and
headers, a chunked, Content-Length or close-delimited body, keep-alive, TLS from ``asyncio``. No proxies,
redirects, cookies or compression (``Accept-Encoding: identity``): an OpenAI endpoint needs none of them.

Pool: an idle connection is reused (the last one freed first), else a new one is opened, so a closed loop of
c slots holds at most c connections (one per slot) and an open loop as many as it has requests in flight.
"""
from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

Pieces = list[tuple[float, bytes]]
MAX_HEAD = 64 * 1024  # a response head longer than this is not HTTP


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.x this client can read."""


class TooLarge(ProtocolError):
    """The response body passed the cap (``Pool.max_body``): the rest is not read, the connection is closed."""


class Lost(Exception):
    """The connection closed before the response ended; ``started``: after the response's head had come."""

    def __init__(self, text: str, started: bool) -> None:
        super().__init__(text)
        self.started = started


@dataclass
class Reply:
    """What a finished response said: status, lower-cased headers, whether its connection can carry the next
    request, and when its body ended (monotonic s)."""

    status: int
    headers: dict[str, str]
    keep_alive: bool
    end: float


class _Conn(asyncio.Protocol):
    """One connection and the response being read on it. States: ``head`` (reading the status line and
    headers), ``size``/``data``/``crlf``/``trailer`` (a chunked body), ``length`` (Content-Length), ``close``
    (a body that ends with the connection), ``idle`` (no response expected)."""

    def __init__(self, drain_s: float, max_body: int = 1 << 62) -> None:
        self.drain_s = drain_s
        self.max_body = max_body
        self.body_bytes = 0  # of the response being read
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.state = "idle"
        self.buf = b""
        self.left = 0  # bytes left in the current chunk or Content-Length body
        self.pieces: Pieces = []
        self.waiter: asyncio.Future[Reply] | None = None
        self.status, self.keep_alive = 0, True
        self.headers: dict[str, str] = {}
        self.drain: asyncio.TimerHandle | None = None
        self.answered = 0  # responses that ended on this connection: above 0, it is a reused keep-alive one
        self.first_byte = 0.0  # when the response being read sent its first byte (monotonic s; 0: not yet)

    # the callbacks -------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport

    def data_received(self, data: bytes) -> None:
        t = time.monotonic()  # first: the arrival of these bytes, before any parsing
        if self.state == "idle":  # nothing was asked: the connection is out of step, never reuse it
            self.keep_alive = False
            return
        if not self.first_byte:
            self.first_byte = t
        try:
            body = self._one_chunk(data) if self.state == "size" and not self.buf else None
            if body is None:
                body = self._feed(self.buf + data if self.buf else data)
        except (ProtocolError, ValueError) as exc:
            self._fail(ProtocolError(f"not an HTTP/1.1 answer: {exc}"))
            return
        if body:
            self.body_bytes += len(body)
            if self.body_bytes > self.max_body:
                self._fail(TooLarge(f"the response passed {self.max_body / 2**20:g} MiB (FARM_MAX_RESPONSE_BYTES); "
                                    "the rest was not read"))
                return
            self.pieces.append((t, body))
            if self.drain is None and b"[DONE]" in body:  # the stream is over: its body gets drain_s to end
                self.drain = asyncio.get_running_loop().call_later(self.drain_s, self._drained)
        if self.state == "done":
            self._finish(t)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.state == "close":  # a body delimited by the connection's end
            self._finish(time.monotonic())
        elif self.state != "idle":
            why = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
            self._fail(Lost(why, self.state != "head"))

    # parsing ------------------------------------------------------------------------------------------------
    @staticmethod
    def _one_chunk(data: bytes) -> bytes | None:
        """The body of a read that holds exactly one whole non-final chunk (a streamed event, the usual read),
        without the general parser: half the cost per read. None for any other read."""
        j = data.find(b"\r\n")
        if j <= 0 or j > 8:
            return None
        size = int(data[:j], 16) if b";" not in data[:j] else 0
        if not size or len(data) != j + size + 4 or data[-2:] != b"\r\n":
            return None
        return data[j + 2:j + 2 + size]

    def _feed(self, buf: bytes) -> bytes:
        """Advance the response's state over ``buf``; the body bytes it held (de-chunked). Leaves an
        incomplete head or chunk-size line in ``self.buf``."""
        body: list[bytes] = []
        i, n = 0, len(buf)
        while i < n and self.state != "done":
            s = self.state
            if s in ("data", "length"):
                take = min(self.left, n - i)
                body.append(buf[i:i + take])
                i += take
                self.left -= take
                if not self.left:
                    self.state = "crlf" if s == "data" else "done"
            elif s == "close":
                body.append(buf[i:])
                i = n
            elif s == "crlf":
                if n - i < 2:
                    break
                if buf[i:i + 2] != b"\r\n":
                    raise ProtocolError("a chunk does not end with CRLF")
                i += 2
                self.state = "size"
            else:
                j = buf.find(b"\r\n\r\n" if s == "head" else b"\r\n", i)
                if j < 0:
                    if n - i > MAX_HEAD:
                        raise ProtocolError("no end of line in 64 KiB")
                    break
                line, i = buf[i:j], j + (4 if s == "head" else 2)
                self._line(s, line)
        self.buf = buf[i:] if i < n and self.state != "done" else b""
        return b"".join(body)

    def _line(self, state: str, line: bytes) -> None:
        """A head, a chunk-size line or a trailer line."""
        if state == "head":
            self._head(line)
        elif state == "size":
            self.left = int(line.split(b";", 1)[0].strip(), 16)
            self.state = "data" if self.left else "trailer"
        elif not line:  # the empty line after the trailers ends the body
            self.state = "done"

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ProtocolError(f"status line {lines[0][:60]!r}")
        status = int(rest.split(" ", 1)[0])
        if 100 <= status < 200:  # an interim answer (100 Continue): the real head follows
            return
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.status, self.headers = status, headers
        conn = headers.get("connection", "").lower()
        self.keep_alive = "close" not in conn and (version == "HTTP/1.1" or "keep-alive" in conn)
        if status in (204, 304):  # never a body
            self.state = "done"
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = "size"
        elif "content-length" in headers:
            self.left = int(headers["content-length"])
            self.state = "length" if self.left else "done"
        else:
            self.state, self.keep_alive = "close", False

    # ending -------------------------------------------------------------------------------------------------
    def _finish(self, t: float) -> None:
        self.state = "idle"
        self.answered += 1
        self._cancel_drain()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(Reply(self.status, self.headers, self.keep_alive and not self.lost, t))

    def _fail(self, exc: Exception) -> None:
        self.state, self.keep_alive = "idle", False
        self._cancel_drain()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def _drained(self) -> None:
        """[DONE] came but the body did not end within ``drain_s``: the response is complete, the connection
        is not reused."""
        self.drain, self.keep_alive = None, False
        self._finish(time.monotonic())
        self.close()

    def _cancel_drain(self) -> None:
        if self.drain is not None:
            self.drain.cancel()
            self.drain = None

    # use ----------------------------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return not self.lost and self.keep_alive and self.transport is not None and not self.transport.is_closing()

    def send(self, data: bytes, pieces: Pieces) -> asyncio.Future[Reply]:
        """Write a request; the future of its response, whose body bytes go to ``pieces`` as they arrive."""
        assert self.transport is not None
        self.state, self.buf, self.pieces, self.body_bytes, self.first_byte = "head", b"", pieces, 0, 0.0
        self.status, self.headers, self.keep_alive = 0, {}, True
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Keep-alive connections to the server of ``base_url`` (``http(s)://HOST[:PORT][/PATH]``); ``authority``: the
    ``Host`` header and TLS name where the URL holds a pinned address (None: the URL's own); ``max_body``: the
    most bytes of one response body read (:class:`TooLarge` past it)."""

    def __init__(self, base_url: str, connect_timeout_s: float, drain_s: float, authority: str | None = None,
                 max_body: int = 1 << 62) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url}")
        self.host, self.tls = u.hostname, u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.path = u.path.rstrip("/")
        self.authority = authority or u.netloc.rsplit("@", 1)[-1]
        self.tls_name = urlsplit(f"//{self.authority}").hostname or self.host
        self.max_body = max_body
        self.connect_timeout_s, self.drain_s = connect_timeout_s, drain_s
        self.idle: list[_Conn] = []
        self.open: set[_Conn] = set()
        self.ssl = ssl.create_default_context() if self.tls else None

    def request_bytes(self, path: str, body: bytes, headers: Iterable[tuple[str, str]]) -> bytes:
        """A POST of ``body`` to ``path`` (under the base URL's path) with ``headers``."""
        lines = [f"POST {self.path}{path} HTTP/1.1", f"Host: {self.authority}", "Accept: */*",
                 "Accept-Encoding: identity", "User-Agent: farm", f"Content-Length: {len(body)}",
                 *(f"{k}: {v}" for k, v in headers)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def acquire(self, fresh: bool = False) -> _Conn:
        """An idle live connection (``fresh``: never), else a new one (OSError or TimeoutError when none can be
        opened)."""
        while self.idle and not fresh:
            conn = self.idle.pop()
            if conn.usable:
                return conn
            self._drop(conn)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await loop.create_connection(lambda: _Conn(self.drain_s, self.max_body), self.host, self.port,
                                                   ssl=self.ssl, server_hostname=self.tls_name if self.ssl else None)
        self.open.add(conn)
        return conn

    def release(self, conn: _Conn, reusable: bool) -> None:
        """Give ``conn`` back after its response ended (``reusable``: its body was read to the end)."""
        if reusable and conn.usable and conn.state == "idle":
            self.idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        self.open.discard(conn)

    def close(self) -> None:
        for conn in list(self.open):
            self._drop(conn)
        self.idle.clear()

"""farm's HTTP/1.1 streaming client (workers.loadgen.openai.http_stream): responses fed to its protocol byte by byte and
in one piece (chunked with extensions and trailers, Content-Length, close-delimited, an interim 100), each read
stamped and de-chunked; broken answers fail the request. No server: a stand-in transport."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from workers.loadgen.openai.http_stream import Lost, Pool, ProtocolError, Reply, _Conn

SSE = b"data: {\"a\": 1}\n\ndata: [DONE]\n\n"


class _Transport:
    def __init__(self) -> None:
        self.sent, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _chunked(body: bytes, ext: bytes = b"", trailer: bytes = b"") -> bytes:
    half = len(body) // 2
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x%s\r\n%s\r\n" % (half, ext, body[:half]) + b"%x\r\n%s\r\n" % (len(body) - half, body[half:])
            + b"0\r\n" + trailer + b"\r\n")


def _read(answer: bytes, step: int, lose: bool = False) -> tuple[Reply | BaseException, list[tuple[float, bytes]]]:
    """Feed ``answer`` to a connection ``step`` bytes a read; the reply (or the error) and the stamped body."""
    async def go() -> tuple[Any, list[tuple[float, bytes]]]:
        conn, pieces = _Conn(drain_s=5.0), []
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        waiter = conn.send(b"POST / HTTP/1.1\r\n\r\n", pieces)
        for i in range(0, len(answer), step):
            conn.data_received(answer[i:i + step])
        if lose:
            conn.connection_lost(None)
        try:
            return await asyncio.wait_for(waiter, 1.0), pieces
        except (Lost, ProtocolError) as exc:
            return exc, pieces
    return asyncio.run(go())


@pytest.mark.parametrize("step", [1, 3, 7, 10_000])
@pytest.mark.parametrize(("ext", "trailer"), [(b"", b""), (b";name=value", b"X-Trailer: 1\r\n")])
def test_chunked_answer_split_anywhere(step: int, ext: bytes, trailer: bytes) -> None:
    reply, pieces = _read(_chunked(SSE, ext, trailer), step)
    assert isinstance(reply, Reply) and reply.status == 200 and reply.keep_alive
    assert reply.headers["content-type"] == "text/event-stream"
    assert b"".join(p for _, p in pieces) == SSE  # de-chunked, nothing lost
    assert all(t1 <= t2 for (t1, _), (t2, _) in zip(pieces, pieces[1:], strict=False))


def test_chunk_aligned_reads() -> None:
    """One read per chunk (how a streaming server's events usually come): the shortcut for whole chunks."""
    events = [b"data: %d\n\n" % i for i in range(20)]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    async def go() -> tuple[Reply, list[tuple[float, bytes]]]:
        conn, pieces = _Conn(drain_s=5.0), []
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        waiter = conn.send(b"POST / HTTP/1.1\r\n\r\n", pieces)
        for read in [head, *(b"%x\r\n%s\r\n" % (len(e), e) for e in events), b"0\r\n\r\n"]:
            conn.data_received(read)
        return await asyncio.wait_for(waiter, 1.0), pieces

    reply, pieces = asyncio.run(go())
    assert reply.status == 200 and [p for _, p in pieces] == events


@pytest.mark.parametrize("step", [1, 10_000])
def test_length_close_delimited_and_interim_answers(step: int) -> None:
    body = b'{"error": "no"}'
    head = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body)
    reply, pieces = _read(b"HTTP/1.1 100 Continue\r\n\r\n" + head + body, step)
    assert isinstance(reply, Reply) and reply.status == 404 and b"".join(p for _, p in pieces) == body
    reply, pieces = _read(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + SSE, step, lose=True)
    assert isinstance(reply, Reply) and not reply.keep_alive and b"".join(p for _, p in pieces) == SSE
    reply, _ = _read(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", step)
    assert isinstance(reply, Reply) and not reply.keep_alive
    reply, _ = _read(b"HTTP/1.1 204 No Content\r\n\r\n", step)  # no body, no length: not read to a close
    assert isinstance(reply, Reply) and reply.status == 204 and reply.keep_alive


def test_broken_answers_fail_the_request() -> None:
    cut = _chunked(SSE)[:-12]
    lost, pieces = _read(cut, 5, lose=True)
    assert isinstance(lost, Lost) and lost.started and pieces  # mid-body: truncated, what came is kept
    lost, _ = _read(b"HTTP/1.1 200", 5, lose=True)
    assert isinstance(lost, Lost) and not lost.started  # before the head ended: no answer
    bad, _ = _read(b"SSH-2.0-OpenSSH\r\n\r\n", 100)
    assert isinstance(bad, ProtocolError)
    bad, _ = _read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 100)
    assert isinstance(bad, ProtocolError)


def test_request_bytes_and_urls() -> None:
    pool = Pool("http://user@127.0.0.1:8000/v1/", 1.0, 1.0)
    data = pool.request_bytes("/chat/completions", b"{}", [("X-Request-Id", "7")])
    assert data.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n")
    assert b"Content-Length: 2\r\n" in data and data.endswith(b"X-Request-Id: 7\r\n\r\n{}")
    assert Pool("https://example.com", 1.0, 1.0).port == 443
    with pytest.raises(ValueError, match="not an http"):
        Pool("grpc://x:1", 1.0, 1.0)

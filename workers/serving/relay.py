"""The one way into a jailed server's network: ``python -m workers.serving.relay --listen-fd N --prefix LINE --
ARGV...`` runs inside the jail (``workers.serving.jail``), whose network namespace has only its own loopback, so the
server it starts (ARGV) can reach nothing: no host service, no other host, no metadata address.

The runner creates a listening socket on the host's loopback before the jail starts and passes it in as file
descriptor N (bubblewrap keeps inherited descriptors). A socket belongs to the network namespace it was created
in, so connections the relay accepts on it come from the host, while the sockets the server itself opens live in
the jail's namespace. The relay starts ARGV, reads its ``LINE HOST:PORT`` line (the port it bound on the jail's
loopback: ``workers.serving.lease_exec``), prints the same line with the host listener's address instead (what
the runner waits for), then copies bytes both ways between each accepted connection and a connection to the
server, until the server exits; it exits with the server's status and passes SIGTERM on.

Why our own relay: bubblewrap has no port forwarding, slirp4netns and pasta are not installed everywhere farm runs
and forward outbound traffic too, and a server that could take the listening socket itself would need an option
none of the engines have. The copy costs each chunk of a stream one ``recv``/``send`` pair in one thread
(``select`` on epoll, ``TCP_NODELAY`` both ways): measured in ``benchmarks/jail_relay.py``.
"""
from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

from workers import signal_stack

CHUNK = 256 * 1024
CONNECT_TIMEOUT_S = 5.0


class _Pipe:
    """One direction of a relayed connection: bytes read from ``src`` waiting to be written to ``dst``."""

    __slots__ = ("src", "dst", "buf", "eof")

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst, self.buf, self.eof = src, dst, b"", False


class Relay:
    """Copies bytes between the connections ``listener`` accepts and the server at ``127.0.0.1:port``."""

    def __init__(self, listener: socket.socket, port: int) -> None:
        self.listener, self.port = listener, port
        self.sel = selectors.DefaultSelector()
        self.pipes: dict[socket.socket, _Pipe] = {}  # by source socket
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            server = socket.create_connection(("127.0.0.1", self.port), timeout=CONNECT_TIMEOUT_S)
        except OSError:
            client.close()  # the server is not there (yet): the client sees the connection end
            return
        for s in (client, server):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pipes[client] = _Pipe(client, server)
        self.pipes[server] = _Pipe(server, client)
        self.sel.register(client, selectors.EVENT_READ)
        self.sel.register(server, selectors.EVENT_READ)

    def _events(self, s: socket.socket) -> int:
        """What to wait for on ``s``: reading while its outgoing pipe is empty, writing while its incoming one
        is not."""
        out = self.pipes[s]
        into = self.pipes[out.dst]
        return ((selectors.EVENT_READ if not out.buf and not out.eof else 0)
                | (selectors.EVENT_WRITE if into.buf else 0))

    def _close(self, s: socket.socket) -> None:
        peer = self.pipes[s].dst
        for x in (s, peer):
            self.pipes.pop(x, None)
            if x.fileno() >= 0 and x in self.sel.get_map():
                self.sel.unregister(x)
            x.close()

    def _flush(self, pipe: _Pipe) -> bool:
        """Write what ``pipe`` holds (and pass its end on once written); False when its destination is gone."""
        if pipe.buf:
            try:
                sent = pipe.dst.send(pipe.buf)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            pipe.buf = pipe.buf[sent:]
        if not pipe.buf and pipe.eof:
            try:
                pipe.dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        return True

    def _readable(self, s: socket.socket) -> bool:
        pipe = self.pipes[s]
        try:
            data = s.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            pipe.eof = True
            if self.pipes[pipe.dst].eof and not self.pipes[pipe.dst].buf:
                return False  # both directions ended
        pipe.buf += data
        return self._flush(pipe)

    def step(self, timeout_s: float | None = 1.0) -> None:
        for key, events in self.sel.select(timeout_s):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            if s is self.listener:
                self._accept()
                continue
            if s not in self.pipes:
                continue
            ok = True
            if events & selectors.EVENT_WRITE:
                ok = self._flush(self.pipes[self.pipes[s].dst])
            if ok and events & selectors.EVENT_READ:
                ok = self._readable(s)
            if not ok:
                self._close(s)
                continue
            for x in (s, self.pipes[s].dst):
                self._register(x)

    def _register(self, s: socket.socket) -> None:
        if s not in self.pipes:
            return
        events = self._events(s)
        registered = s in self.sel.get_map()
        if events and registered:
            self.sel.modify(s, events)
        elif events:
            self.sel.register(s, events)
        elif registered:
            self.sel.unregister(s)


def _inner_port(proc: subprocess.Popen[str], prefix: str) -> tuple[int, str]:
    """The port the server printed on its ``prefix HOST:PORT`` line, and that line; SystemExit when it ended first."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return int(line.split()[-1].rsplit(":", 1)[1]), line
        sys.stdout.write(line)
    raise SystemExit(proc.wait() or 1)


def _drain(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()


def _on_exit(proc: subprocess.Popen[str]) -> Callable[[], None]:
    def wait() -> None:
        code = proc.wait()
        sys.stdout.flush()
        os._exit(code if code >= 0 else 128 - code)  # the relay ends with its server

    return wait


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.serving.relay")
    p.add_argument("--listen-fd", type=int, required=True, help="the host's listening socket, inherited")
    p.add_argument("--prefix", default=None, help="the server's 'PREFIX HOST:PORT' line giving its port")
    p.add_argument("--port", type=int, default=None, help="the server's port (without --prefix)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command or (a.prefix is None) == (a.port is None):
        p.error("give the server's command after --, and one of --prefix or --port")
    listener = socket.socket(fileno=a.listen_fd)
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, text=True,
                            stdout=subprocess.PIPE if a.prefix is not None else None)
    signal_stack.install(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    port = a.port
    if a.prefix is not None:
        port, _ = _inner_port(proc, a.prefix)
        host, outer = listener.getsockname()[:2]
        print(f"{a.prefix}{host}:{outer}", flush=True)
        threading.Thread(target=_drain, args=(proc,), daemon=True).start()
    threading.Thread(target=_on_exit(proc), daemon=True).start()
    assert port is not None
    relay = Relay(listener, port)
    while True:
        relay.step()


if __name__ == "__main__":
    raise SystemExit(main())

"""A stand-in LLM server for the jail's tests: ``python -m tests.workers.serving.jail_probe PORT HOST_PORT FILE``
serves HTTP on ``127.0.0.1:PORT`` (inside the jail: its own loopback) and answers ``GET /probe`` with what it could
reach from where it runs: a listener on the host's loopback (``HOST_PORT``), an outside address, the worker's
environment, a write to the model ``FILE``; every other path answers ``ok``."""
from __future__ import annotations

import json
import os
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _try(fn: object) -> str:
    try:
        fn()  # type: ignore[operator]
    except OSError as exc:
        return f"refused: {type(exc).__name__}: {exc.strerror or exc}"
    return "reached"


def probe(host_port: int, model: str) -> dict[str, object]:
    def write() -> None:
        with open(model, "ab") as f:
            f.write(b"x")

    return {
        "host_loopback": _try(lambda: socket.create_connection(("127.0.0.1", host_port), timeout=2).close()),
        "outside": _try(lambda: socket.create_connection(("192.0.2.1", 80), timeout=2).close()),
        "model_write": _try(write),
        "farm_env": sorted(k for k in os.environ if k.startswith("FARM_") or "SECRET" in k),
        "uid": os.getuid(),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    }


def main() -> None:
    port, host_port, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(probe(host_port, model)).encode() if self.path == "/probe" else b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()

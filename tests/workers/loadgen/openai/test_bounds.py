"""Bounds before allocation (issue 39 point 5): prompt tokens checked at submit against the model's context and the
host's cap, and again on the worker before a prompt is built; the synthetic pool bounded in all; response bodies
capped per request; prompt files capped in size."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from farm.errors import LoadGenError
from farm.settings import reset_settings
from schemas import MeasurementSettings
from schemas.llm import LlmSettings
from tests.fake_openai import fake_server
from tests.helpers import farm, farm_env
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.loadgen.openai.workload import POOL_TOKENS, pool_size, synthetic_prompts

LLM = ["--duration", "1", "--window", "0.5", "--warmup", "0.3"]


def test_a_huge_prompt_is_refused_at_submit_in_one_line() -> None:
    """Finding: ``--input-tokens 1000000 --prefix-tokens 1000000 -c 1`` was accepted and drove the process to
    12.5 GB before one measured request. Now it is refused at submit (its dry run too: the same checks, and a
    safe way to run this test against code that accepts it), before anything is built."""
    with fake_server(model="m") as url:
        proc = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "m", "--input-tokens",
                    "1000000", "--prefix-tokens", "1000000", "-c", "1", *LLM, "--dry-run", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "FARM_MAX_PROMPT_TOKENS" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_models_context_bounds_prompt_and_output(tiny_llama: Any) -> None:
    """The tiny GGUF declares 2048 tokens of context (read from its metadata at submit): 1500 + 1000 do not fit;
    a smaller n_ctx knob bounds it further."""
    proc = farm("submit", str(tiny_llama.gguf), "--input-tokens", "1500", "--output-tokens", "1000", "--dry-run",
                check=False)
    assert proc.returncode == 2 and "do not fit the model's context of 2048 tokens" in proc.stderr, proc.stderr
    proc = farm("submit", str(tiny_llama.gguf), "--input-tokens", "300", "--output-tokens", "300", "--knob",
                "n_ctx=512", "--dry-run", check=False)
    assert proc.returncode == 2 and "context of 512 tokens" in proc.stderr, proc.stderr
    assert farm("submit", str(tiny_llama.gguf), "--input-tokens", "300", "--dry-run").returncode == 0


def test_the_worker_checks_again_before_building(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that did not pass this worker's submit (another host's settings, a crafted spec) is refused on the
    worker before one prompt is built."""
    monkeypatch.setenv("FARM_MAX_PROMPT_TOKENS", "1000")
    reset_settings()
    settings = MeasurementSettings(duration_s=1.0, warmup_s=0.2, window_s=0.5,
                                   llm={"api": "openai-chat", "input_tokens": 1_000_000, "prefix_tokens": 1_000_000})
    with fake_server(model="m") as url:
        t = time.monotonic()
        with pytest.raises(LoadGenError, match="FARM_MAX_PROMPT_TOKENS"):
            run_load(LoadTarget(url.split("//")[1], "m"), LoadSpec.from_settings([], 1, 1, settings))
    assert time.monotonic() - t < 30


def test_the_synthetic_pool_is_bounded_in_all() -> None:
    llm = LlmSettings(input_tokens=100_000, output_tokens=4)
    assert pool_size(llm) == POOL_TOKENS // 100_000
    assert pool_size(LlmSettings(input_tokens=128)) == 512
    prompts = synthetic_prompts(LlmSettings(input_tokens="20000/1000000", output_tokens=4), None)
    assert len(prompts) == 1  # one prompt of up to 4.02 M words fills the pool (a draw is cut at mean + 4 stddev)
    assert max(p.input_tokens for p in prompts) <= 20_000 + 4 * 1_000_000


@contextmanager
def endless_server() -> Iterator[str]:
    """An OpenAI-looking server whose streamed answers never end: 64 KiB every 10 ms (6.4 MB/s per stream)."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                if data.startswith(b"GET"):
                    body = b'{"data": [{"id": "m"}]}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                piece = b"data: " + b"x" * 65536 + b"\n\n"
                chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                while not stop.is_set():
                    conn.sendall(chunk)
                    time.sleep(0.01)
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        sock.close()


def test_a_response_body_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: response bodies accumulated without a cap until the request's time-out (up to a day). Now a body
    past FARM_MAX_RESPONSE_BYTES fails its request at once (RESPONSE_TOO_LARGE) and is read no further."""
    monkeypatch.setenv("FARM_MAX_RESPONSE_BYTES", str(256 << 10))
    reset_settings()
    settings = MeasurementSettings(duration_s=1.0, warmup_s=0.2, window_s=0.5,
                                   llm={"api": "openai-chat", "input_tokens": 4, "output_tokens": 4})
    with endless_server() as hostport, pytest.raises(LoadGenError, match="RESPONSE_TOO_LARGE") as err:
        run_load(LoadTarget(hostport, "m"), LoadSpec.from_settings([], 1, 1, settings))
    assert "FARM_MAX_RESPONSE_BYTES" in str(err.value)


def test_a_prompt_file_over_the_cap_is_refused_at_submit(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello there"}\n' * 200)
    with fake_server(model="m") as url:
        proc = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "m", "--prompts",
                    str(prompts), *LLM, check=False, env=farm_env(FARM_MAX_WORKLOAD_FILE_BYTES="1000"))
    assert proc.returncode == 2 and "FARM_MAX_WORKLOAD_FILE_BYTES" in proc.stderr, proc.stderr

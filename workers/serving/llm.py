"""What the LLM engines (protocol ``openai`` on their ``schemas.engines`` card) share: the command line wrapper
that gives a server its leased core count and a free port (``workers.serving.lease_exec``), the readiness check
(a one-token chat completion over HTTP: llama-cpp-python's server has no ``/health``, and a server that
answers ``/health`` may still be loading its model), and the check that the engine's package is there."""
from __future__ import annotations

import importlib.util
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

from farm.errors import ServerError, UnsupportedError
from schemas import JobSpec
from workers.serving.base import Site
from workers.serving.lease_exec import CORES, LISTEN_LINE, PORT

POLL_S = 0.2  # seconds between readiness polls
CALL_TIMEOUT_S = 30.0  # one readiness completion (the first one may compile or warm the model)
WRAPPER = "workers.serving.lease_exec"
#: what farm's image variant ``<tag>-llm`` (one per extra: the same for both CPU LLM engines) copies from the
#: worker's Python: llama-cpp-python's and ``transformers serve``'s requirements, which the image builder does
#: not follow by itself (``workers.images``)
LLM_DISTRIBUTIONS = (
    "llama_cpp_python", "diskcache", "sse_starlette", "starlette_context", "pydantic_settings", "python_dotenv",
    "transformers", "tokenizers", "safetensors", "huggingface_hub", "hf_xet", "regex", "filelock", "fsspec",
    "packaging", "tqdm", "torch", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fastapi", "starlette",
    "annotated_doc", "anyio", "idna", "sniffio", "uvicorn", "h11", "click", "typer", "shellingham", "rich",
    "markdown_it_py", "mdurl", "pygments", "pyyaml", "typing_inspection", "openai", "jiter", "httpx2", "httpcore2",
    "truststore", "pillow", "accelerate", "colorama", "setuptools")


def wrap(site: Site, argv: Sequence[str], env_threads: Sequence[str] = (), cuda_index: bool = False,
         env_cpus: Sequence[str] = ()) -> list[str]:
    """``argv`` started through the lease wrapper (``{cores}`` and ``{port}`` filled in where it runs), each
    of ``env_threads`` set to the leased core count and each of ``env_cpus`` to the leased cores' CPU list;
    ``cuda_index``: the server reads ``CUDA_VISIBLE_DEVICES`` as indices only, so the wrapper turns the runner's GPU
    UUID into its index."""
    envs = [a for name in env_threads for a in ("--env", name)]
    envs += [a for name in env_cpus for a in ("--env-cpus", name)]
    cuda = ["--cuda-index"] if cuda_index else []
    return [site.python, "-m", WRAPPER, *envs, *cuda, "--bind", _bind_host(site), "--", *argv]


def _bind_host(site: Site) -> str:
    return "127.0.0.1" if site.host in ("0.0.0.0", "") else site.host


def port_arg(site: Site) -> str:
    """The server's ``--port`` value: the site's port, or (port 0) a free one the wrapper picks and prints."""
    return PORT if site.port == 0 else str(site.port)


def listen_prefix(site: Site) -> str | None:
    """The line the runner reads the port from (only when the wrapper picks it)."""
    return LISTEN_LINE if site.port == 0 else None


def threads_arg(spec: JobSpec) -> str:
    """``n_threads``: the job's knob, else the leased core count (filled in by the wrapper)."""
    value = spec.knobs.get("n_threads")
    return CORES if value is None else str(value)


def require_module(spec: JobSpec, site: Site, module: str, install: str) -> None:
    """UnsupportedError when a local process cannot import the engine's package ``module``."""
    if site.container or importlib.util.find_spec(module) is not None:
        return
    raise UnsupportedError(f"job {spec.job_id} runs on the {spec.engine} engine, whose package {module} is not "
                           f"installed on this worker; {install}")


def post_json(url: str, body: dict[str, object], timeout_s: float) -> tuple[int, str]:
    """POST ``body`` as JSON to ``url``; (HTTP status, the first 4 KiB of the answer)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - http to the job's own server
            return int(resp.status), resp.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(4096).decode(errors="replace")


def wait_openai_ready(url: str, model_name: str, timeout_s: float, alive: Callable[[], bool] | None = None) -> None:
    """Poll a one-token chat completion of ``model_name`` at ``http://url/v1`` until it answers 200. Raises
    ServerError after ``timeout_s``, as soon as ``alive()`` is False, or at once on a 4xx other than 404/408/429
    (a request the server will never take: the message holds its answer)."""
    deadline = time.monotonic() + timeout_s
    endpoint = f"http://{url}/v1/chat/completions"
    body: dict[str, object] = {"model": model_name, "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 1, "stream": False}
    last = "no answer yet"
    while True:
        if alive is not None and not alive():
            raise ServerError(f"the LLM server for {model_name!r} at {url} exited before it was ready (last seen: "
                              f"{last}); its log follows")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServerError(f"the LLM server at {url} did not answer a completion within {timeout_s:g} s (last "
                              f"seen: {last}); raise FARM_SERVER_READY_TIMEOUT_S for a large model")
        try:
            status, text = post_json(endpoint, body, max(0.5, min(CALL_TIMEOUT_S, remaining)))
        except (OSError, urllib.error.URLError) as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        else:
            if status == 200:
                return
            last = f"HTTP {status}: {' '.join(text.split())[:300]}"
            if 400 <= status < 500 and status not in (404, 408, 429):
                raise ServerError(f"the LLM server at {url} refused a completion of model {model_name!r} ({last})")
        time.sleep(POLL_S)

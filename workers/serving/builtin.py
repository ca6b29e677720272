"""farm's built-in KServe v2 gRPC server (``workers.engines.server``), the serving engine of every in-process
engine (``schemas.engines.IN_PROCESS``). Its command line is built here only: by :func:`server_argv`, for
both runners (through :func:`job_argv`) and for the benchmarks."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from farm.sandbox import runs_code
from schemas import JobSpec
from schemas.engines import SERVED_MODEL_NAME
from workers.engines.backends import BACKENDS
from workers.engines.server import LISTEN_PREFIX
from workers.serving.base import Launch, ServingEngine, Site

SERVER_MODULE = "workers.engines.server"
#: the start of the line the server prints once bound: ``farm-serve listening HOST:PORT``
LISTEN_LINE = f"{LISTEN_PREFIX} "


def server_argv(model: str, *, model_format: str, engine: str, python: str = sys.executable,
                host: str = "127.0.0.1", port: int = 0, device: str | None = None, threads: int = 0,
                instances: int = 1, model_name: str = SERVED_MODEL_NAME, extra: Sequence[str] = ()) -> list[str]:
    """The built-in server's command line for the file ``model`` (as the server sees it), run by ``python``,
    bound to ``host:port`` (0: a free port, printed); ``device`` None: the server's default (cpu);
    ``extra``: further server options (e.g. ``--max-queue-delay-us 500``)."""
    return [python, "-m", SERVER_MODULE, model, "--format", model_format, "--engine", engine,
            "--host", host, "--port", str(port), *(["--device", device] if device is not None else []),
            "--threads", str(threads), "--instances", str(instances), "--model-name", model_name, *extra]


def input_args(spec: JobSpec) -> list[str]:
    """``--input name:DTYPE:-1xDIMS`` per input: TorchScript carries no shapes, so the server is told them."""
    if spec.model_format != "torchscript":
        return []
    out: list[str] = []
    for t in spec.inputs:
        out += ["--input", f"{t.name}:{t.dtype}:" + "x".join(str(d) for d in (-1, *t.shape))]
    return out


def batching_args(spec: JobSpec) -> list[str]:
    """The built-in server's dynamic batching options for the job (none when batching is off)."""
    m = spec.measurement
    if m.max_queue_delay_us is None:
        return []
    pref = [] if m.preferred_batch_size is None else ["--preferred-batch-size", str(m.preferred_batch_size)]
    return ["--max-queue-delay-us", str(m.max_queue_delay_us), *pref]


def job_argv(spec: JobSpec, model: str, site: Site) -> list[str]:
    """The built-in server's command line for ``spec`` on ``site``, serving ``model`` (as the server sees it)."""
    m = spec.measurement
    return server_argv(model, model_format=spec.model_format, engine=spec.engine, python=site.python,
                       host=site.host, port=site.port, device=spec.device, threads=m.threads,
                       instances=m.instances, extra=(*batching_args(spec), *input_args(spec)))


class BuiltinServer(ServingEngine):
    """The built-in server running one in-process engine's backend (``workers.engines.backends``)."""

    def __init__(self, engine: str) -> None:
        self.name = engine
        self.package = BACKENDS[engine].package

    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        model = site.path(model_path)
        return Launch(argv=job_argv(spec, model, site), port=site.port, model=model, mounts=site.mounts(model_path),
                      listen_prefix=LISTEN_LINE,
                      # a model that runs code is jailed keeping the host's network: no relay inside gRPC's
                      # sub-millisecond latencies; a format that runs no code is parsed by farm's own server, unjailed
                      sandbox="host-network" if runs_code(spec.model_format) else "none")

"""Which client measures a job, in one place: the registry of load clients keyed by ``settings.client``,
``auto``'s choice among them, and :func:`run_load`, the entry point every caller uses.

Adding a client: its module (a ``contract.LoadClient`` returning a ``contract.LoadRecord``) and its entry in
``CLIENTS`` (and its name in ``schemas.request.MeasurementSettings.client``).
"""
from __future__ import annotations

from farm.errors import LoadGenError
from schemas import MeasurementSettings, TensorSpec
from schemas.input_data import InputData
from workers.loadgen.contract import LoadClient, LoadJob, LoadResult
from workers.loadgen.openai_client import OpenAIClient
from workers.loadgen.patterns import pattern_for
from workers.loadgen.perf_analyzer_client import PerfAnalyzerClient
from workers.loadgen.plan import WindowPlan
from workers.loadgen.result import to_result
from workers.loadgen.run import FarmClient

CLIENTS: dict[str, type[LoadClient]] = {c.name: c for c in (FarmClient, PerfAnalyzerClient, OpenAIClient)}
#: ``auto``: the first of these that can measure the job; the last one always measures it
AUTO = (PerfAnalyzerClient.name, FarmClient.name)


def measure(job: LoadJob) -> LoadResult:
    """Measure ``job`` with the client its settings name, or under ``auto`` with the first of :data:`AUTO` that
    can (the result's notes say why the ones before it did not). Raises LoadGenError when the named client
    cannot measure the job or fails."""
    wanted = job.settings.client
    speaking = (OpenAIClient.name,) if job.settings.llm is not None else AUTO  # the clients of the job's protocol
    names = speaking if wanted == "auto" else (wanted,)
    skipped: list[tuple[str, str]] = []
    for name in names:
        client = CLIENTS[name]()
        why = client.why_not(job)
        if why is not None and wanted != "auto":
            others = " or ".join(f"--client {n}" for n in speaking if n != wanted)
            raise LoadGenError(f"the {wanted} client cannot measure this job: {why}"
                               + (f"; use {others}" if others else ""))
        if why is None:
            try:
                record = client.run(job, WindowPlan.of(job.settings, extendable=client.stops_when_stable))
            except LoadGenError as exc:
                if name == names[-1]:
                    raise
                why = f"{name} failed ({exc})"
            else:
                return to_result(job, record, [f"measured by {client.title}, not {s}: {w}" for s, w in skipped])
        skipped.append((name, why))
    raise LoadGenError("no load client can measure this job: " + "; ".join(f"{s}: {w}" for s, w in skipped))


def run_load(url: str, model_name: str, inputs: list[TensorSpec], batch_size: int, concurrency: int,
             settings: MeasurementSettings, *, processes: int | None = None,
             connect_timeout_s: float = 10.0, seed: int = 0, in_process: bool = False,
             data: InputData | None = None) -> LoadResult:
    """Drive the KServe v2 gRPC server at ``url`` (``host:port``) with inference requests for
    ``model_name`` and measure latency and throughput; ``settings.rpc`` picks unary ModelInfer calls or
    ModelStreamInfer streams; ``settings.client`` NVIDIA perf_analyzer (``perf_analyzer_client``), farm's own
    generator (``run``), or ``auto``: perf_analyzer where it can run the job, else farm's generator (the
    reason in the notes).

    Closed loop (``settings.mode == "closed"``): ``concurrency`` requests always outstanding, each a
    batch of ``batch_size``. Open loop (``constant``/``poisson``): ``settings.rate`` requests/s, latency
    counted from each request's scheduled send time (``patterns``). ``processes``, ``in_process``: farm's
    generator's client processes (``run.FarmClient``); ``details["client_process"]`` says where the client ran.
    ``data``: which values the tensors hold (None: random; see ``request.input_tensor``); the result's
    details record it (``input_data``).
    Raises LoadGenError when the server is unreachable or no request succeeded.
    """
    if batch_size < 1 or concurrency < 1:
        raise LoadGenError(f"batch_size and concurrency must be >= 1, got {batch_size} and {concurrency}")
    return measure(LoadJob(url=url, model_name=model_name, inputs=tuple(inputs), batch_size=batch_size,
                           concurrency=concurrency, settings=settings, pattern=pattern_for(settings, concurrency),
                           data=data, seed=seed, connect_timeout_s=connect_timeout_s, processes=processes,
                           in_process=in_process))

"""Which client measures a job, in one place: the registry of load clients keyed by ``settings.client``,
``auto``'s choice among them, and :func:`run_load`, the entry point every caller uses.

Adding a client: its module (a ``contract.LoadClient`` returning a ``contract.LoadRecord``) and its entry in
``CLIENTS`` (and its name in ``schemas.request.MeasurementSettings.client``).
"""
from __future__ import annotations

from farm.errors import LoadGenError
from workers.loadgen.contract import LoadClient, LoadJob, LoadResult, LoadSpec, LoadTarget
from workers.loadgen.kserve.client import FarmClient
from workers.loadgen.openai.client import OpenAIClient
from workers.loadgen.perf_analyzer.client import PerfAnalyzerClient
from workers.loadgen.plan import WindowPlan
from workers.loadgen.result import to_result

CLIENTS: dict[str, type[LoadClient]] = {c.name: c for c in (FarmClient, PerfAnalyzerClient, OpenAIClient)}
#: ``auto``: the first of these that can measure the job; the last one always measures it
AUTO = (PerfAnalyzerClient.name, FarmClient.name)


def measure(job: LoadJob) -> LoadResult:
    """Measure ``job`` with the client its settings name, or under ``auto`` with the first of :data:`AUTO` that
    can (the result's notes say why the ones before it did not). Raises LoadGenError when the named client
    cannot measure the job or fails."""
    wanted = job.settings.client
    speaking = (OpenAIClient.name,) if job.protocol == "openai" else AUTO  # the clients of the job's protocol
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


def run_load(target: LoadTarget, spec: LoadSpec, *, processes: int | None = None, connect_timeout_s: float = 10.0,
             seed: int = 0, in_process: bool = False) -> LoadResult:
    """Drive the KServe v2 gRPC server of ``target`` (``host:port``, model name) with ``spec``'s inference requests
    and measure latency and throughput; ``settings.rpc`` picks unary ModelInfer calls or ModelStreamInfer streams;
    ``settings.client`` NVIDIA perf_analyzer (``perf_analyzer.client``), farm's own generator (``kserve.client``),
    or ``auto``: perf_analyzer where it can run the job, else farm's generator (the reason in the notes).

    ``spec.load`` (``schemas.load_levels``) says how requests are offered, each a batch of ``batch_size``: a closed loop
    keeps its concurrency outstanding; an open loop (constant/Poisson) sends its rate requests/s, latency counted
    from each request's scheduled send time. ``processes``, ``in_process``: farm's generator's client processes
    (``run.FarmClient``); ``details["client_process"]`` says where the client ran. ``spec.data``: which values the
    tensors hold (None: random; see ``request.input_tensor``); the result's details record it (``input_data``).
    ``target.authority``, ``target.in_flight_cap``: an endpoint job's name (where the url is the address it was
    pinned to) and cap on requests in flight (``farm.egress``).
    Raises LoadGenError when the server is unreachable or no request succeeded.
    """
    if spec.batch_size < 1:
        raise LoadGenError(f"batch_size must be >= 1, got {spec.batch_size}")
    return measure(LoadJob(url=target.url, model_name=target.model_name, inputs=tuple(spec.inputs),
                           batch_size=spec.batch_size, load=spec.load, settings=spec.settings, data=spec.data,
                           seed=seed, connect_timeout_s=connect_timeout_s, processes=processes, in_process=in_process,
                           authority=target.authority, in_flight_cap=target.in_flight_cap, protocol=spec.protocol))

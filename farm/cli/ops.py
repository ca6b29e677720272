"""Operator commands: ``farm worker``, ``farm serve``, ``farm db upgrade``, ``farm example-model``,
``farm analyze``."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import typer
from rich.table import Table

from farm.cli.followups import next_hint
from farm.cli.hooks import register_hooks
from farm.cli.op_profile_cmd import layers_cmd
from farm.cli.request_options import FORMAT_HELP, SERVE_ENGINE_HELP
from farm.cli.views import console, err_console, safe_row, say
from farm.db.create import ensure_database
from farm.db.migrate import is_current, upgrade
from farm.db.roles import grant_reader
from farm.errors import ConfigError, RequestError
from farm.formatting import safe_text
from farm.logs import setup_logging
from farm.models.analysis import analyze as run_analysis
from farm.models.analysis import headline
from farm.models.examples import EXAMPLE_KINDS, LLM_KINDS, build_example
from farm.models.info import detect_format, inspect_model, tensor_spec
from farm.models.llm_examples import GGUF_NAME, HF_NAME
from farm.op_layers import LAYER_FORMATS
from farm.sandbox import jail_argv, model_jail
from farm.settings import get_settings, mask_url, reset_settings
from schemas.engines import FORMAT_ENGINE
from schemas.metrics import MODEL_METRICS


def worker(
    runner: str | None = typer.Option(None, "--runner", envvar="FARM_RUNNER", help="auto | docker | process"),
    burst: bool = typer.Option(False, "--burst", help="Drain the queues, then exit."),
    queues: str | None = typer.Option(None, "--queues", "-Q", help="Comma-separated subset of the queues this "
                                         "host can serve (default: all of them)."),
    gpus: str | None = typer.Option(None, "--gpus", help="Comma-separated GPUs to run slots on, by NVML index "
                                    "or UUID (default: every GPU; one slot per GPU)."),
    slot: int | None = typer.Option(None, "--slot", hidden=True, help="Run only this slot (set by the worker "
                                    "for its slot processes)."),
    worker_id: str | None = typer.Option(None, "--worker-id", envvar="FARM_WORKER_ID"),
    loglevel: str = typer.Option("INFO", "--loglevel", envvar="FARM_LOGLEVEL"),
    allow_commands: bool = typer.Option(False, "--allow-commands", help="Run edge profiles' own `command:` "
                                        "(code from the request's submitter, with a clean environment); "
                                        "default: such jobs fail. Same as FARM_ALLOW_COMMANDS=1."),
) -> None:
    """Run a worker: register hardware, heartbeat, consume the queues this host can serve (one slot per GPU)."""
    from farm.telemetry import serve_metrics, slot_port  # noqa: PLC0415 - prometheus_client: +0.035 s on every CLI start, measured
    from workers.hardware import detect_hardware  # noqa: PLC0415 - psutil: +0.02 s on every CLI start, measured
    from workers.node import WorkerNode, new_worker_id  # noqa: PLC0415 - celery, prometheus_client, psutil: +0.11 s on every CLI start, measured
    from workers.runners.select import make_runner  # noqa: PLC0415 - the serving stack: +0.26 s on every CLI start, measured
    from workers.slots import SlotSupervisor, build_slots, self_argv, slot_worker_id  # noqa: PLC0415 - with it

    if allow_commands:  # a setting, so that slot processes and every job of this worker see it
        os.environ["FARM_ALLOW_COMMANDS"] = "1"
        reset_settings()
    settings = get_settings()
    if settings.embedded:
        raise ConfigError("farm worker needs a broker: set FARM_BROKER_URL (e.g. redis://127.0.0.1:6379/0)")
    setup_logging(loglevel, settings.log_format)
    wid = worker_id or new_worker_id()
    hardware = detect_hardware(docker=False)
    if queues:
        wanted = [q.strip() for q in queues.split(",") if q.strip()]
        unknown = [q for q in wanted if q not in hardware.queues]
        if unknown:
            raise ConfigError(f"this host cannot serve queue(s) {', '.join(unknown)}; it serves: "
                              f"{', '.join(hardware.queues)}")
        hardware = hardware.model_copy(update={"queues": wanted})
    try:
        slots = build_slots(hardware, gpus)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--gpus'") from None
    if slot is None and len(slots) > 1:
        err_console.print(f"worker {wid}: {len(slots)} slots: " + "; ".join(
            f"{s.index}: GPU {s.gpu_index} {s.gpu_uuid} ({', '.join(s.queues)})" for s in slots))
        passed = [a for opt, v in (("--runner", runner), ("-Q", queues), ("--gpus", gpus),
                                   ("--loglevel", loglevel)) if v for a in (opt, v)] + (["--burst"] if burst else [])
        raise typer.Exit(SlotSupervisor(slots, lambda s: self_argv(
            [*passed, "--slot", str(s.index), "--worker-id", slot_worker_id(wid, s)]), burst).run())
    if slot is not None and not 0 <= slot < len(slots):
        raise typer.BadParameter(f"this host has slots 0-{len(slots) - 1}", param_hint="'--slot'")
    mine = slots[slot or 0]
    run, why = make_runner(runner or settings.runner, wid, mine.gpus if mine.gpu is not None else hardware.gpus)
    hardware = hardware.model_copy(update={"docker": run.name == "docker"})
    err_console.print(f"worker {wid}: {why}; slot {mine.index} (GPU {mine.gpu_uuid or 'none'}); queues "
                      f"{', '.join(mine.queues)}; database {mask_url(settings.db_url)}; broker "
                      f"{mask_url(settings.broker_url)}")
    register_hooks()
    with WorkerNode(runner=run, hardware=hardware, worker_id=wid, slot=mine, slot_count=len(slots)) as node, \
            serve_metrics(node.metrics.registry, slot_port(settings.metrics_port, mine.index), settings.metrics_addr,
                          f"worker {wid}"):
        if burst:
            n = node.drain()
            err_console.print(f"burst: handled {n} message(s)")
        else:
            node.serve_forever(loglevel=loglevel.upper())


def serve(
    model: Path = typer.Argument(..., help="Model file."),
    model_format: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    engine: str | None = typer.Option(None, "--engine", help=SERVE_ENGINE_HELP),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8001, "--port", help="gRPC port; 0 picks a free one."),
    device: str = typer.Option("cpu", "--device", help="cpu | gpu:<product>"),
    threads: int = typer.Option(0, "--threads", help="Intra-op threads (0 = engine default)."),
    instances: int = typer.Option(1, "--instances", help="Model instances (parallel sessions)."),
    model_name: str | None = typer.Option(None, "--model-name", help="Served name (default: the file's stem)."),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", help="Triton-style Prometheus /metrics for Model Analyzer and perf_analyzer "
        "(default: --port + 1, as Triton's 8001/8002; any free port with --port 0); -1: off."),
) -> None:
    """Serve MODEL over the KServe v2 gRPC protocol (farm's built-in server), with the model-repository
    extension (load/unload/index) and a /metrics endpoint, so Triton's tools can drive it."""
    from workers.engines.repository import default_model_name  # noqa: PLC0415 - grpc, tritonclient: +0.12 s on every CLI start, measured
    from workers.engines.server import ServerConfig, run_server  # noqa: PLC0415 - as above
    from workers.serving.builtin import server_argv  # noqa: PLC0415 - as above (it imports the server)

    fmt = model_format or detect_format(model)
    name = model_name or default_model_name(model)
    if model_jail(fmt, model.name):  # the same server, in the jail: the model's code gets no secret, no host write
        served_metrics = serve_metrics_port(port, metrics_port)
        argv = server_argv(str(model.resolve()), model_format=fmt, engine=engine or FORMAT_ENGINE[fmt], host=host,
                           port=port, device=device, threads=threads, instances=instances, model_name=name,
                           extra=() if served_metrics is None else ("--metrics-port", str(served_metrics)))
        jailed = jail_argv(argv, network=True, read_only=[model])
        os.execvp(jailed[0], jailed)
    run_server(ServerConfig(model_path=model, model_format=fmt, engine=engine or FORMAT_ENGINE[fmt], host=host,
                            port=port, device=device, threads=threads, instances=instances, model_name=name,
                            metrics_port=serve_metrics_port(port, metrics_port)))


def serve_metrics_port(port: int, metrics_port: int | None) -> int | None:
    """``farm serve``'s metrics port: the one given (-1: None, off), else Triton's layout (gRPC 8001,
    metrics 8002: the gRPC port + 1), or any free port when the gRPC port is picked (0)."""
    if metrics_port is not None:
        return None if metrics_port < 0 else metrics_port
    return port + 1 if port else 0


def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Create or migrate farm's tables (FARM_DATABASE_URL); a missing Postgres database is created first
    when the role may (else the error says the `createdb` to run)."""
    url = get_settings().db_url
    if ensure_database(url):
        console.print(f"created database {mask_url(url)}")
    upgrade(revision=revision)
    console.print(f"database {mask_url(get_settings().db_url)} is at revision {revision}")
    say(grant_reader(url, get_settings().reader_role), to=err_console)


def db_check(wait: float = typer.Option(0.0, "--wait", help="Seconds to wait for the newest schema (pods' "
                                         "init containers wait for the migration job).")) -> None:
    """Exit 0 when the database (FARM_DATABASE_URL) is at farm's newest schema revision, else 1."""
    url = get_settings().db_url
    deadline = time.monotonic() + max(0.0, wait)
    why = "not at the newest revision"
    while True:
        try:
            if is_current(url):
                console.print(f"database {mask_url(url)} is at farm's newest schema")
                return
            why = "not at the newest revision"
        except Exception as exc:  # not reachable yet (a starting Postgres): waited for like an old schema
            why = f"unreachable ({type(exc).__name__})"
        if time.monotonic() >= deadline:
            raise ConfigError(f"database {mask_url(url)} is {why}; run `farm db upgrade` (the chart's migration job)")
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))


def example_model(out: Path = typer.Argument(..., help="Output file (a directory for tiny-llama)."),
                  kind: str = typer.Option("convnet", "--kind", help="mlp | convnet | identity | compute | memory | "
                                           "bert-tiny | resnet18 (| torchscript-KIND for mlp, convnet, bert-tiny, "
                                           "resnet18, with farm[torch]) | tiny-llama (with farm[llm])")) -> None:
    """Write an example model (seeded random weights) for demos and tests: small graphs, or real
    architectures (bert-tiny: 6-layer BERT-style encoder, give --input input_ids:INT64:128; resnet18;
    tiny-llama: a 2-layer Llama as DIR/tiny-llama.gguf and the Hugging Face folder DIR/tiny-llama-hf)."""
    if kind not in EXAMPLE_KINDS:
        raise RequestError(f"--kind {kind!r} is unknown; use one of: {', '.join(EXAMPLE_KINDS)}")
    path = build_example(kind, out)
    if kind in LLM_KINDS:
        say(f"wrote {kind} to {path}: {GGUF_NAME} (llama.cpp) and {HF_NAME}/ (transformers, vllm)")
        return
    say(f"wrote {kind} model to {path}")
    inputs = " --input input_ids:INT64:32" if "bert" in kind else ""  # a sequence length the model leaves open
    next_hint(f"farm submit {path}{inputs} --dry-run (the matrix, nothing run)",
              f"farm submit {path}{inputs} -b 1,8 -c 1,4")


def analyze(model: Path = typer.Argument(..., help="Model file."),
            input_spec: list[str] | None = typer.Option(None, "--input", "-i", help="name:dtype:shape"),
            model_format: str | None = typer.Option(None, "--format"),
            as_json: bool = typer.Option(False, "--json"),
            layers: bool = typer.Option(False, "--layers", help="Per graph node: MACs/FLOPs, params, output bytes "
                                        "(ONNX, TorchScript); with --job, joined with that job's op profile: "
                                        "GFLOP/s, GB/s."),
            batch: int = typer.Option(1, "--batch", min=1, help="With --layers: the batch of one call."),
            job: str | None = typer.Option(None, "--job", help="With --layers: a job id whose op profile "
                                           "(--op-profile) the layers join; its batch size is used."),
            peak_gflops: float | None = typer.Option(None, "--peak-gflops", min=0.0, help="With --layers --job: "
                                                     "the device's peak GFLOP/s (else the profile's measured one).")
            ) -> None:
    """Static metrics: parameters, size, MACs/FLOPs per sample, activation memory (--layers: per node)."""
    given = [tensor_spec(t) for t in input_spec] if input_spec else None
    if layers:  # ONNX and TorchScript (layers_cmd refuses the rest before reading it)
        fmt = model_format or detect_format(model)
        inputs = inspect_model(model, fmt, given).inputs if fmt in LAYER_FORMATS else []  # TorchScript: jailed
        layers_cmd(model, fmt, inputs, batch, job, peak_gflops, as_json)
        return
    report = run_analysis(model, model_format, given)  # checks the file and inputs first (one jailed run, if any)
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return
    table = Table(title=safe_text(f"{model.name} ({report['format']}, {', '.join(report['inputs'])})"))
    for col in ("metric", "value", "unit"):
        table.add_column(col, justify="right" if col == "value" else "left")
    for m in MODEL_METRICS:
        table.add_row(m.name, headline(report, m.name), m.unit)
    console.print(table)
    ops_table = Table(title="per operator")
    for col in ("op", "count", "MACs", "FLOPs"):
        ops_table.add_column(col, justify="left" if col == "op" else "right")
    for op, row in sorted(report.get("ops", {}).items(), key=lambda kv: -(kv[1].get("macs") or 0)):
        safe_row(ops_table, op, str(row["count"]), *("unknown" if row.get(k) is None else f"{row[k]:,}"
                                                    for k in ("macs", "flops")))
    console.print(ops_table)
    for note in report.get("notes", []):
        say(f"note: {note}")
    if not report.get("complete", True):
        say(f"incomplete: no counting rule or shape for {report.get('unknown_ops')}; "
            "the MAC/FLOP totals are lower bounds (>=)", to=err_console)


def register(app: typer.Typer, db_app: typer.Typer) -> None:
    """Attach the operator commands to the CLI."""
    app.command()(worker)
    app.command()(serve)
    app.command("example-model")(example_model)
    app.command()(analyze)
    db_app.command("upgrade")(db_upgrade)
    db_app.command("check")(db_check)

"""``farm submit``'s options, declared once against the request model (``schemas.request.ProfileRequest``).

Each :class:`Opt` names the request field its value goes to (``field``: a dotted path, ``measurement.max_windows``;
None for an option of the command itself, ``--wait``), its flags and its help, in which ``{default}`` is the
field's default as the model declares it, so the help cannot drift from the model. :func:`command` gives
``submit`` its parameters from :data:`SUBMIT_OPTIONS`; :func:`request_data` turns the values given into the
request dict (``farm.cli.request_options``: options win over the request file's fields).
``tests/farm/cli/test_submit_options.py`` checks every option against its field (name, default, help)."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import BaseModel

from farm.cli import llm_options, request_options
from farm.cli.request_options import build_request_dict, load_request_file, parse_knobs
from schemas import ProfileRequest
from schemas.llm import LLM_APIS, TokenDist
from schemas.llm_engines import knob_help
from schemas.request import GOODPUT_START_RATE, LOAD_CLIENTS, MAX_REPEATS

F = TypeVar("F", bound=Callable[..., Any])
#: the placeholder of a help text for its field's default (``shown``)
DEFAULT = "{default}"


@dataclass(frozen=True)
class Opt:
    """One ``farm submit`` parameter: ``name`` (the Python name), ``flags`` (none: the argument), its type,
    ``field`` (where its value goes in the request; None: the command's own), ``group`` (how it gets there:
    ``matrix``, ``measurement``, ``extra``, ``llm``; ``cli``: the command's own), ``help`` and ``default`` (None:
    the request file's value, else the model's)."""

    name: str
    flags: tuple[str, ...]
    kind: Any
    field: str | None
    group: str
    help: str
    default: Any = None
    given_as: str | None = None  # the key its value has in its group, where not the field's last part

    @property
    def key(self) -> str:
        """The key its value has in its group (the field's last part, or ``given_as``)."""
        return self.given_as or (self.field or self.name).rsplit(".", 1)[-1]


def _m(name: str, flag: str, kind: Any, key: str, text: str) -> Opt:
    """A measurement option: its value goes to ``measurement.<key>`` (a list of serving settings, ``--threads 1,2``,
    to the request's list of that name; ``--rate``, to its ``rates``: ``request_options.build_request_dict``)."""
    return Opt(name, (flag,), kind, "rates" if key == "rate" else f"measurement.{key}", "measurement", text,
               given_as=key)


def _llm(name: str, kind: Any, text: str) -> Opt:
    """An LLM option (``--input-tokens``): its value goes to ``measurement.llm.<name>``."""
    return Opt(name, ("--" + name.replace("_", "-"),), kind, f"measurement.llm.{name}", "llm", text)


SUBMIT_OPTIONS: tuple[Opt, ...] = (
    Opt("model", (), str | None, "model", "matrix", "Model file (ONNX or TorchScript)."),
    Opt("engine", ("--engine", "-e"), list[str] | None, "engines", "matrix", request_options.ENGINE_HELP),
    Opt("device", ("--device", "-d"), list[str] | None, "devices", "matrix",
        "cpu | gpu | gpu:<product>; repeat (default {default})."),
    Opt("batch_sizes", ("--batch-sizes", "-b"), str | None, "batch_sizes", "matrix",
        "Batch sizes, a list: 1,4,16 (default {default})."),
    Opt("concurrency", ("--concurrency", "-c"), str | None, "concurrency", "matrix",
        "Requests in flight, a list: 1,4 (default {default})."),
    Opt("edge", ("--edge",), list[str] | None, "edge", "matrix", "cpus=1,memory=512m[,name=N][,cpuset=0-1]; repeat."),
    Opt("input_spec", ("--input", "-i"), list[str] | None, "inputs", "matrix",
        "name:dtype:shape, e.g. x:FP32:3x224x224"),
    Opt("model_format", ("--format",), str | None, "format", "matrix", request_options.SUBMIT_FORMAT_HELP),
    Opt("request_file", ("-f", "--file"), Path | None, None, "cli", "Request file (YAML or JSON)."),
    Opt("name", ("--name",), str | None, "name", "matrix", "A name for the request."),
    _m("duration", "--duration", float | None, "duration_s", "Fixed measurement time per job, s (default: windows "
       "until stable)."),
    _m("windows", "--windows", int | None, "max_windows", "Maximum measurement windows per job (default {default})."),
    _m("window", "--window", float | None, "window_s", "Measurement window length, s (default {default} s)."),
    _m("warmup", "--warmup", float | None, "warmup_s", "Warm-up time, s (default {default})."),
    _m("stability", "--stability", float | None, "stability_pct", "Stability bound, % (default {default})."),
    _m("stability_latency", "--stability-latency", str | None, "stability_latency", "mean (default, perf_analyzer's "
       "rule) | p50 | p99: the latency that must agree across windows, with throughput."),
    _m("rate", "--rate", str | None, "rate", request_options.RATE_HELP),
    _m("mode", "--mode", str | None, "mode", "closed | constant | poisson | trace (set by --trace) "
       "(default {default})."),
    _m("rpc", "--rpc", str | None, "rpc", "unary (default) | stream: ModelInfer calls or ModelStreamInfer streams."),
    _m("threads", "--threads", str | None, "threads", "Server intra-op threads, a list: 1,2 (0: engine default) "
       "(default {default})."),
    _m("instances", "--instances", str | None, "instances", "Server model instances, a list: 1,2 (default {default})."),
    _m("queue_delay", "--max-queue-delay-us", str | None, "max_queue_delay_us", "Dynamic batching delays, µs, e.g. "
       "0,500,2000 (default: no dynamic batching)."),
    _m("preferred_batch", "--preferred-batch-size", int | None, "preferred_batch_size", "Dynamic batching: run a "
       "batch as soon as it has this many rows."),
    _m("search", "--search", str | None, "search", "brute (default: every concurrency and rate) | quick (the "
       "scheduler walks or bisects concurrency, or in open loop the --rate list, per serving configuration) | "
       "max-goodput (LLM, with --slo: the highest Poisson rate keeping 95 % of requests within the SLO, doubling "
       f"then bisecting from --rate, default {GOODPUT_START_RATE:g} req/s)."),
    _m("p99", "--p99", float | None, "p99_ms", "Quick search latency budget, ms: the highest throughput with p99 "
       "within it (the highest concurrency or rate)."),
    _m("client", "--client", str | None, "client", f"{' | '.join(LOAD_CLIENTS)} (default {DEFAULT}): the load "
       "generator. auto: perf_analyzer where installed and able (unary calls, a server answering ModelConfig), else "
       "farm's own; with --api: openai, farm's OpenAI streaming client."),
    _m("timeout", "--timeout", float | None, "timeout_s", "Per-job time limit, s (default {default} s)."),
    Opt("op_profile", ("--op-profile",), bool, "measurement.op_profile", "measurement", "After each job's load "
        "measurement, a short pass with the engine's op profiler: time per node (`farm ops JOB_ID`).", False),
    Opt("repeats", ("--repeats",), int | None, "repeats", "extra", f"Runs of each cell (1 to {MAX_REPEATS}, default "
        "{default}), interleaved round by round; `farm results` shows their median and range, `farm compare` needs "
        "several to judge."),
    Opt("input_data", ("--input-data",), str | None, "input_data", "extra", "random (default) | zeros | FILE (.npz or "
        ".json, one array per input, rows cycled)."),
    Opt("endpoint", ("--endpoint",), str | None, "endpoint", "extra", "HOST:PORT of a running KServe v2 gRPC server "
        "to profile instead of a model file (with --model-name); with --api: http://HOST:PORT\\[/v1] of an "
        "OpenAI-compatible LLM server."),
    Opt("served_name", ("--model-name",), str | None, "model_name", "extra", "The model to profile on --endpoint."),
    Opt("knob", ("--knob",), list[str] | None, "knobs", "extra", "NAME=V1[,V2...] (repeatable): an LLM engine's "
        f"setting as a matrix dimension. {knob_help()}."),
    _llm("api", str | None, f"{' | '.join(LLM_APIS)}: profile an LLM server over the OpenAI API (--endpoint "
         "http://HOST:PORT\\[/v1], --model-name NAME); streamed, TTFT/ITL/tokens per s."),
    _llm("credential", str | None, "An endpoint credential the workers' operator set up (FARM_ENDPOINT_CREDENTIALS), "
         "by name: its key is sent as a bearer token by the worker; never stored, and not sent by the submit-time "
         "check."),
    _llm("input_tokens", str | None, "Prompt tokens: N, MEAN/STDDEV or MIN:MAX (default {default})."),
    _llm("output_tokens", str | None, "Output tokens asked for (max_tokens): N, MEAN/STDDEV or MIN:MAX "
         "(default {default})."),
    _llm("prefix_tokens", int | None, "A prefix of N tokens shared by every prompt."),
    _llm("seed", int | None, "Seed of the synthetic prompts and lengths (same prompts every run)."),
    _llm("prompts", str | None, "Prompt file: JSONL ({\"prompt\": ...}) or ShareGPT JSON, uploaded with the request "
         "(FARM_MAX_WORKLOAD_FILE_BYTES)."),
    _llm("trace", str | None, "Replay a request trace on its own schedule: Mooncake JSONL (timestamp ms, input_length, "
         "output_length, hash_ids), BurstGPT CSV or Azure LLM trace CSV, uploaded with the request; sets --mode trace, "
         "its rate and --requests."),
    _llm("trace_speed", float | None, "The trace's time scale: its gaps divided by this (default {default}; 2: twice "
         "as fast)."),
    _llm("trace_tokens", float | None, "The trace's token scale: every length and the hash ids' block size times "
         "this (default {default}; 0.0625: 1/16 for a small host)."),
    _llm("trace_limit", int | None, "Replay the trace's first N requests only."),
    _llm("sessions", str | None, "Multi-turn conversations, each turn sent with its history (the earlier prompts and "
         "the server's answers): N synthetic turns of --input-tokens each (answers of --output-tokens), or sharegpt: "
         "the --prompts ShareGPT file's conversations replayed whole. -c N keeps N sessions in flight; --rate R starts "
         "R sessions/s. Results show TTFT and the prefix-cache share per turn."),
    _llm("think_ms", float | None, "Sessions: the think time between an answer and the next turn, ms (default "
         "{default})."),
    _llm("tokenizer", str | None, "Hugging Face tokenizer (folder or tokenizer.json), uploaded with the request and "
         "parsed only in the sandbox: exact prompt lengths, and token counts where the server sends no usage."),
    _llm("slo", str | None, "Latency goals for goodput, ms: ttft=MS,tpot=MS,e2e=MS (any of them)."),
    _llm("requests", int | None, "LLM jobs: measure this many requests (instead of the windows)."),
    _llm("warmup_requests", int | None, "LLM jobs: requests sent first and left out."),
    Opt("wait", ("--wait",), bool, None, "cli", "Cluster mode: wait for all jobs and print results.", False),
    Opt("as_json", ("--json",), bool, None, "cli", "Print {\"request_id\": ...} (and results with --wait).", False),
    Opt("dry_run", ("--dry-run",), bool, None, "cli", "Print the matrix (jobs, left-out combinations, searches, "
        "estimated time) and exit; nothing is stored or run.", False),
)


def model_field(path: str) -> tuple[type[BaseModel], str]:
    """(the model class holding it, the field's name) of a dotted request field path; KeyError: no such field."""
    model: type[BaseModel] = ProfileRequest
    *parents, leaf = path.split(".")
    for part in parents:
        model = next(t for t in _types(model.model_fields[part].annotation) if issubclass(t, BaseModel))
    if leaf not in model.model_fields:
        raise KeyError(f"{model.__name__} has no field {leaf!r}")
    return model, leaf


def _types(annotation: Any) -> list[type]:
    return [t for t in getattr(annotation, "__args__", (annotation,)) if isinstance(t, type)]


def field_default(path: str) -> Any:
    """The default the request model declares for a dotted field path (its factory's value)."""
    model, leaf = model_field(path)
    info = model.model_fields[leaf]
    return info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]


def shown(value: Any) -> str:
    """A field's default as ``--help`` shows it: ``1,4`` for a list, ``0.5`` for a float, ``128`` for a fixed
    token length."""
    if isinstance(value, TokenDist):
        return f"{value.a:g}" if value.kind == "fixed" else f"{value.a:g}:{value.b:g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def help_text(opt: Opt) -> str:
    """The option's help with its field's default in place of ``{default}``."""
    if DEFAULT not in opt.help or opt.field is None:
        return opt.help
    return opt.help.replace(DEFAULT, shown(field_default(opt.field)))


def command(fn: F) -> F:
    """``fn`` with ``submit``'s parameters (:data:`SUBMIT_OPTIONS`) as its signature, for Typer."""
    params = []
    for o in SUBMIT_OPTIONS:
        default = (typer.Option(o.default, *o.flags, help=help_text(o)) if o.flags
                   else typer.Argument(o.default, help=help_text(o)))
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=o.kind))
    fn.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    fn.__annotations__ = {**{o.name: o.kind for o in SUBMIT_OPTIONS}, "return": None}
    return fn


def with_options(names: tuple[str, ...]) -> Callable[[F], F]:
    """``fn`` (taking ``**opts``) with ``submit``'s options ``names`` added to its own parameters, for Typer: another
    command (``farm compare --interleaved``) takes them as ``submit`` declares them."""
    chosen = [o for o in SUBMIT_OPTIONS if o.name in names and o.flags]

    def wrap(fn: F) -> F:
        own = [p for p in inspect.signature(fn).parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
        added = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.kind,
                                   default=typer.Option(o.default, *o.flags, help=help_text(o))) for o in chosen]
        fn.__signature__ = inspect.Signature(own + added, return_annotation=None)  # type: ignore[attr-defined]
        fn.__annotations__ = {**fn.__annotations__, **{o.name: o.kind for o in chosen}}
        return fn
    return wrap


def request_data(opts: dict[str, Any]) -> dict[str, Any]:
    """The request dict of ``farm submit``'s option values (by :class:`Opt` name): the request file's fields
    (``-f``) with the options given over them."""
    by_group: dict[str, dict[str, Any]] = {}
    for o in SUBMIT_OPTIONS:
        by_group.setdefault(o.group, {})[o.key] = opts[o.name]
    matrix, measurement, extra = by_group["matrix"], by_group["measurement"], by_group["extra"]
    measurement["op_profile"] = measurement["op_profile"] or None  # the flag unset: the file's, or the default
    extra["knobs"] = parse_knobs(extra["knobs"])
    base = load_request_file(opts["request_file"]) if opts["request_file"] else {}
    data = build_request_dict(base, matrix["model"], matrix["engines"], matrix["devices"], matrix["batch_sizes"],
                              matrix["concurrency"], matrix["edge"], matrix["inputs"], matrix["format"],
                              matrix["name"], measurement, extra=extra)
    return llm_options.apply(data, **by_group["llm"])

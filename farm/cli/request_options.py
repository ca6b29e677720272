"""Building a ProfileRequest from ``farm submit`` options and an optional YAML/JSON request file."""
from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any, Literal, TypedDict

import typer
import yaml

from farm.errors import RequestError
from farm.models.info import tensor_spec
from farm.readers.results import RECENT_RE
from schemas.engines import ENGINES, IN_PROCESS, LLM_FORMAT_ENGINE, MODEL_FORMATS
from schemas.knobs import parse_knob

_MEASUREMENT_FLAGS = ("duration_s", "window_s", "warmup_s", "max_windows", "min_windows", "stability_pct",
                      "stability_latency", "mode", "timeout_s", "rpc", "preferred_batch_size", "search",
                      "p99_ms", "client", "op_profile")
#: help texts whose choices and defaults come from the contract (``schemas``), so they cannot drift from it
ENGINE_HELP = f"{' | '.join(ENGINES)}; repeat."
SERVE_ENGINE_HELP = f"{' | '.join(IN_PROCESS)} (default: by format)."
FORMAT_HELP = f"{' | '.join(MODEL_FORMATS)} (default: detected)."
#: farm submit also takes the LLM formats: a GGUF file, a Hugging Face model folder
SUBMIT_FORMAT_HELP = f"{' | '.join((*MODEL_FORMATS, *LLM_FORMAT_ENGINE))} (default: detected)."

#: context settings of the commands taking a request id: ``-1``, ``-2`` (the newest requests) reach it as an id,
#: not as an unknown option (``farm.readers.results.find_request`` resolves them; any other unknown option is
#: refused there)
ID_ARGS: dict[str, Any] = {"ignore_unknown_options": True}
#: the help of a request-id argument
ID_HELP = "Request id: the id, a unique prefix, latest, or -1, -2, ... (the newest requests)."


def request_ids(value: Any) -> Any:
    """The callback of a request-id argument: ``-1``, ``-2`` pass (``ID_ARGS`` lets them through as ids); any other
    text starting with ``-`` is the unknown option it is, a usage error (exit 2) as without ``ID_ARGS``."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str) and v.startswith("-") and not RECENT_RE.match(v):
            raise importlib.import_module(typer.BadParameter.__module__).NoSuchOption(v)
    return value


#: ``--rate``'s help: ``START:END:STEP`` with Rich's emoji codes broken up (``:END:`` would print as an emoji)
RATE_HELP = ("Open-loop request rates, req/s: 100, a list 50,100,200 or a range START:END[none]:[/none]STEP "
             "(50:400:50); one job per rate, or the levels of --search quick.")
#: serving-configuration options given as comma-separated lists (``--instances 1,2``): request-level lists
_SERVING_LIST_FLAGS = {"instances": "--instances", "threads": "--threads", "max_queue_delay_us": "--max-queue-delay-us"}


def parse_int_list(text: str, name: str) -> list[int]:
    """``"1,4,16"`` → [1, 4, 16]; a one-line RequestError otherwise."""
    try:
        return [int(p) for p in text.replace(" ", "").split(",") if p != ""]
    except ValueError:
        raise RequestError(f"{name} must be a comma-separated list of whole numbers like 1,4,16, "
                           f"got {text!r}") from None


MAX_RATE_LEVELS = 1000  # the most rates one --rate may expand to


def parse_rates(text: str) -> list[float]:
    """``--rate``: ``"100"``, ``"50,100,200"`` or ``START:END:STEP`` (``"50:400:50"``: 50, 100, ..., 400, the
    end included when the steps reach it), items mixable with commas; requests/s. A one-line RequestError
    otherwise."""
    out: list[float] = []
    for item in text.replace(" ", "").split(","):
        if item:
            out += _rate_range(item, text) if ":" in item else [_rate_number(item, text)]
        if len(out) > MAX_RATE_LEVELS:
            raise RequestError(f"--rate {text!r} expands to over {MAX_RATE_LEVELS} rates; use a larger step")
    if not out:
        raise RequestError("--rate needs requests/s: 100, a list 50,100,200 or a range START:END:STEP like 50:400:50")
    return out


def _rate_number(item: str, text: str) -> float:
    try:
        value = float(item)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise RequestError(f"--rate {text!r}: {item!r} is not a number; use requests/s like 50,100,200 "
                           "or a range START:END:STEP like 50:400:50")
    return value


def _rate_range(item: str, text: str) -> list[float]:
    parts = item.split(":")
    if len(parts) != 3:
        raise RequestError(f"--rate {text!r}: a range is START:END:STEP like 50:400:50, got {item!r}")
    start, end, step = (_rate_number(p, text) for p in parts)
    if step <= 0 or end < start:
        raise RequestError(f"--rate {text!r}: the range {item} needs STEP > 0 and END >= START")
    n = math.floor((end - start) / step + 1e-9) + 1
    if n > MAX_RATE_LEVELS:
        raise RequestError(f"--rate {text!r} expands to over {MAX_RATE_LEVELS} rates; use a larger step")
    return [round(start + i * step, 9) for i in range(n)]


class EdgeArgs(TypedDict, total=False):
    """An ``--edge`` profile as given (``schemas.specs.EdgeProfile`` fields, its text: the request validates it)."""

    cpus: str
    memory: str
    name: str
    cpuset: str


_EDGE_KEYS: tuple[Literal["cpus", "memory", "name", "cpuset"], ...] = ("cpus", "memory", "name", "cpuset")


def parse_edge(text: str) -> EdgeArgs:
    """``cpus=1,memory=512m[,name=N][,cpuset=0-1]`` → an edge profile dict (cpuset: a range or one CPU;
    lists like ``0,2`` go in a request file)."""
    out = EdgeArgs()
    for part in text.split(","):
        if not part.strip():
            continue
        given, sep, value = part.partition("=")
        key = next((k for k in _EDGE_KEYS if k == given.strip()), None)
        if not sep or key is None:
            raise RequestError(f"--edge {text!r}: expected key=value pairs of cpus, memory, name, cpuset "
                               "(e.g. cpus=1,memory=512m)")
        out[key] = value.strip()
    for required in ("cpus", "memory"):
        if required not in out:
            raise RequestError(f"--edge {text!r} needs {required}= (e.g. cpus=1,memory=512m)")
    return out


def load_request_file(path: Path) -> dict[str, Any]:
    """Read a request file (YAML or JSON) into a dict; relative model paths resolve against the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise RequestError(f"cannot read request file {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except Exception as exc:
        raise RequestError(f"request file {path} is not valid YAML/JSON: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(data, dict):
        raise RequestError(f"request file {path} must hold a mapping of request fields")
    for key in ("model", "input_data"):  # relative paths resolve against the request file
        value = data.get(key)
        if isinstance(value, str) and value.lower() not in ("random", "zeros") and not Path(value).is_absolute():
            data[key] = str((path.parent / value).resolve())
    return data


def build_request_dict(base: dict[str, Any], model: str | None, engines: list[str] | None,
                       devices: list[str] | None, batch_sizes: str | None, concurrency: str | None,
                       edges: list[str] | None, inputs: list[str] | None, fmt: str | None, name: str | None,
                       measurement: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Merge command-line options over the request file's fields (options win). ``extra``: further
    top-level fields given on the command line (``input_data``, ``endpoint``, ``model_name``,
    ``repeats``), None where not given."""
    data = dict(base)
    data.update({k: v for k, v in (extra or {}).items() if v is not None})
    if isinstance(data.get("input_data"), str) and data["input_data"].strip().lower() not in ("random", "zeros"):
        data["input_data"] = str(Path(data["input_data"]).expanduser().resolve())
    if model:
        data["model"] = model
    if "model" not in data and "endpoint" not in data:
        raise RequestError("give a model file: farm submit MODEL, or -f request.yaml with a model: field, or a "
                           "running server: --endpoint HOST:PORT --model-name NAME")
    _set_matrix(data, engines, devices, batch_sizes, concurrency, edges, inputs, fmt, name)
    _set_measurement(data, measurement)
    return data


def _set_matrix(data: dict[str, Any], engines: list[str] | None, devices: list[str] | None,
                batch_sizes: str | None, concurrency: str | None, edges: list[str] | None, inputs: list[str] | None,
                fmt: str | None, name: str | None) -> None:
    """Put the matrix options given on the command line (engines, devices, batch sizes, concurrency, edge
    profiles, inputs, format, name) into ``data``."""
    if engines:
        data["engines"] = engines
    if devices:
        data["devices"] = devices
    if batch_sizes is not None:
        data["batch_sizes"] = parse_int_list(batch_sizes, "--batch-sizes")
    if concurrency is not None:
        data["concurrency"] = parse_int_list(concurrency, "--concurrency")
    if edges:
        data["edge"] = [parse_edge(e) for e in edges]
    if inputs:
        data["inputs"] = [tensor_spec(t).model_dump() for t in inputs]
    if fmt:
        data["format"] = fmt
    if name:
        data["name"] = name


def _set_measurement(data: dict[str, Any], measurement: dict[str, Any]) -> None:
    """Put the serving lists and measurement options given on the command line into ``data`` (over the
    file's ``measurement``)."""
    for key, flag in _SERVING_LIST_FLAGS.items():
        if measurement.get(key) is not None:
            data[key] = parse_int_list(str(measurement[key]), flag)
    given = {k: v for k, v in measurement.items() if v is not None and k in _MEASUREMENT_FLAGS}
    if measurement.get("rate") is not None:  # --rate replaces the file's rates and its measurement.rate
        data["rates"] = parse_rates(str(measurement["rate"]))
        given["rate"] = None
    if given:
        merged = dict(data.get("measurement") or {})
        merged.update(given)
        data["measurement"] = {k: v for k, v in merged.items() if not (k == "rate" and v is None)}


def parse_knobs(items: list[str] | None) -> dict[str, list[str]] | None:
    """``--knob NAME=V1,V2`` options as the request's ``knobs`` (None when none is given); a name given twice
    is refused."""
    if not items:
        return None
    out: dict[str, list[str]] = {}
    for item in items:
        try:
            name, values = parse_knob(item)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        if name in out:
            raise RequestError(f"--knob {name} is given twice; list its values once: {name}=A,B")
        out[name] = values
    return out

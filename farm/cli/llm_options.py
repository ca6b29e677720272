"""What ``farm submit``'s options for LLM servers over the OpenAI API (``schemas.llm.LlmSettings``; declared in
``farm.cli.submit_options``) add to a request: ``measurement.llm``, and the endpoint reader that checks the server."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from farm import traces
from farm.endpoint import Attach
from farm.errors import RequestError
from farm.sandbox import jail_unavailable
from farm.settings import get_settings
from schemas import ProfileRequest
from schemas.llm import LlmSettings
from schemas.request import MAX_RATE, MEASUREMENT_DEFAULTS
from workers.loadgen.openai.jailed_workload import open_workload


def apply(data: dict[str, Any], **given: Any) -> dict[str, Any]:
    """``data`` (a request dict) with the options given on the command line in ``measurement.llm`` (over the
    request file's); unchanged when no LLM option was given. A path is made absolute."""
    opts = {k: v for k, v in given.items() if v is not None}
    if not opts:
        return with_trace(data)
    for key in ("prompts", "trace", "tokenizer"):
        if key in opts:
            opts[key] = str(Path(opts[key]).expanduser().resolve())
    measurement = dict(data.get("measurement") or {})
    measurement["llm"] = {**(measurement.get("llm") or {}), **opts}
    return with_trace({**data, "measurement": measurement})


def with_trace(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the trace its ``measurement.llm`` names on this host read (a bad line is a one-line
    RequestError) and what it sets: mode ``trace`` at its mean rate, no warm-up, its requests counted; unchanged
    without a trace (or with one stored already)."""
    measurement, llm = data.get("measurement"), None
    if isinstance(measurement, dict):
        llm = measurement.get("llm")
    if not isinstance(measurement, dict) or not isinstance(llm, dict) or not isinstance(llm.get("trace"), str):
        return data  # no trace to read here (or a malformed request: its own check says what is wrong)
    measurement, llm = dict(measurement), dict(llm)
    path = str(llm["trace"])
    if data.get("rates") is not None or measurement.get("rate") is not None:
        raise RequestError("a trace (--trace) is sent on its own schedule: drop --rate")
    fields = LlmSettings.model_fields
    speed, tokens, limit = (llm.get(k, fields[k].default) for k in ("trace_speed", "trace_tokens", "trace_limit"))
    if not all(isinstance(v, int | float) and v > 0 for v in (speed, tokens)):
        return data  # the request's own check says what is wrong
    trace = traces.read(Path(path), path, float(tokens), limit if isinstance(limit, int) else None,
                        get_settings().max_workload_file_bytes)
    span = trace.offsets_s(float(speed))[-1]
    limit_s = measurement.get("timeout_s") or MEASUREMENT_DEFAULTS["timeout_s"]
    if span >= limit_s:
        raise RequestError(f"--trace {path}: its {len(trace.rows)} requests span {span:.0f} s at --trace-speed "
                           f"{speed:g}, past the job's time limit of {limit_s:g} s; raise --timeout or --trace-speed, "
                           "or lower --trace-limit")
    llm.update(requests=len(trace.rows), warmup_requests=0)
    measurement.update(mode=measurement.get("mode") or "trace", rate=min(trace.rate(float(speed)), MAX_RATE),
                       warmup_s=0.0, llm=llm)
    return {**data, "measurement": measurement}


def check_workload(llm: LlmSettings) -> None:
    """Read the workload's own files as a job will (a bad prompt file or tokenizer is a usage error at submit): the
    tokenizer in the sandbox. A cluster's submitting host without one leaves the tokenizer to the workers (they
    refuse it without a sandbox of their own); an embedded run, where this host is the worker, refuses it here."""
    if not llm.files():
        return
    s = get_settings()
    if llm.tokenizer is not None and not s.embedded and not s.trusted_models and jail_unavailable() is not None:
        llm = llm.model_copy(update={"tokenizer": None})
    with open_workload(llm, submitting=True):  # RequestError names the bad line or file
        pass


def attach_for(request: ProfileRequest, fallback: Attach) -> Attach:
    """The endpoint reader of ``request``: the OpenAI API's for an LLM request (its workload checked first:
    :func:`check_workload`), else ``fallback`` (KServe v2). The OpenAI reader sends no key: a credential's value
    is read only on the worker."""
    llm = request.measurement.llm
    if llm is None:
        return fallback
    check_workload(llm)
    if request.endpoint is None:  # an LLM engine farm launches: nothing runs yet to read
        return fallback
    from workers.serving.openai_api import attach_openai  # noqa: PLC0415 - the OpenAI client: LLM submits only
    return functools.partial(attach_openai, llm=llm, authority=request.endpoint)

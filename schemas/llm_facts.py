"""What an LLM job ran with, stored as queryable columns of its result row (``results``, the ``job_results``
view, ``farm results --wide``, the exports): the engine's knobs as the server got them (``n_threads`` filled in
from the job's core lease where the request left it to the lease), where token counts came from, and the
workload (prompt and output lengths, shared prefix, seed, prompt file). The model file's hash is the request's
(``requests.model_sha256``, the ``model_sha256`` column of the view and exports).

The worker builds it (:meth:`LlmFacts.of`) from the job's spec, its leased server cores and the load client's
token sources; a job that is not an LLM job has none (the columns stay NULL)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from schemas.job import JobSpec
from schemas.knobs import N_THREADS, KnobValue
from schemas.llm import LlmSettings, file_label
from schemas.llm_engines import KNOBS


class LlmFacts(BaseModel):
    """One LLM job's facts (see the module docstring). ``knobs``: every knob the job set, plus ``n_threads``
    (the effective thread count) for an engine that has it; ``n_threads`` again as its own column (the one
    knob every CPU engine has); ``tokenizer``: the client's ``--tokenizer`` (a path as given; None: none);
    ``token_source``: what counted the output tokens of most requests (``usage``: the server's own tokenizer,
    ``tokenizer``: the client's, ``chunks``: one per streamed chunk); ``input_tokens``/``output_tokens``: the
    length specs as written (``128``, ``128/32``, ``64:256``); ``prefix_tokens``: the shared prefix, tokens;
    ``workload_seed``: the prompts' seed; ``prompts``: the prompt file (None: synthetic prompts), the sessions
    (``sessions: 4 turns in 128, think 500 ms``), or the trace a replay sent with its scales (``trace NAME (sha256
    ...), speed x1, tokens x0.0625``: its own lengths, so no ``input_tokens``/``output_tokens``);
    ``server``: the server program that ran and its version
    (``llama-server 0.6.0-dev (build 0, commit unknown)``; None: the engine has one server only, or it never
    started)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knobs: dict[str, KnobValue]
    n_threads: int | None = None
    tokenizer: str | None = None
    token_source: str | None = None
    input_tokens: str | None = None
    output_tokens: str | None = None
    prefix_tokens: int | None = None
    workload_seed: int | None = None
    prompts: str | None = None
    server: str | None = None

    @classmethod
    def of(cls, spec: JobSpec, server_cores: int | None, token_sources: Mapping[str, Mapping[str, int]] | None = None,
           server: Mapping[str, str] | None = None) -> LlmFacts | None:
        """The facts of LLM job ``spec`` (None when it is not one: no ``measurement.llm``) whose server ran on
        ``server_cores`` leased cores (None: unknown, e.g. a running endpoint farm did not start);
        ``token_sources``: the load client's counts of each source (``{"output": {"usage": 12}}``); ``server``: the
        launch's ``name`` and ``version`` of the server program (``workers.serving.base.Launch.server``)."""
        llm = spec.measurement.llm
        if llm is None:
            return None
        knobs = dict(spec.knobs)
        if N_THREADS.name in KNOBS.get(spec.engine, {}) and N_THREADS.name not in knobs and server_cores:
            knobs[N_THREADS.name] = int(server_cores)
        threads = knobs.get(N_THREADS.name)
        return cls(knobs=knobs, n_threads=int(threads) if isinstance(threads, int | float) else None,
                   tokenizer=file_label(llm.tokenizer),
                   token_source=_main_source((token_sources or {}).get("output")),
                   input_tokens=None if llm.trace else llm.input_tokens.text(),
                   output_tokens=None if llm.trace else llm.output_tokens.text(),
                   prefix_tokens=llm.prefix_tokens, workload_seed=llm.seed, prompts=_source(llm),
                   server=server_label(server))

    def columns(self) -> dict[str, Any]:
        """The facts as results-table columns (:data:`LLM_FACT_COLUMNS`)."""
        return self.model_dump()


def _source(llm: LlmSettings) -> str | None:
    """What the prompts came from: the prompt file, the trace with its scales, or the sessions (None: synthetic)."""
    if llm.sessions is not None:
        what = f"{llm.sessions} turns in {llm.input_tokens.text()}" if isinstance(llm.sessions, int) else \
            f"conversations of {file_label(llm.prompts)}"
        return f"{SESSIONS_MARK} {what}, think {llm.think_ms:g} ms"
    if llm.trace is None:
        return file_label(llm.prompts)
    first = f", first {llm.trace_limit}" if llm.trace_limit else ""
    return f"trace {file_label(llm.trace)}, speed x{llm.trace_speed:g}, tokens x{llm.trace_tokens:g}{first}"


#: how the ``prompts`` fact of a sessions workload begins
SESSIONS_MARK = "sessions:"


def server_label(server: Mapping[str, str] | None) -> str | None:
    """``NAME VERSION`` of a launched server (None: not named)."""
    if not server or not server.get("name"):
        return None
    return f"{server['name']} {server.get('version', '')}".strip()[:200]


def _main_source(counts: Mapping[str, int] | None) -> str | None:
    """The source that counted most requests (ties: by name, for a stable answer)."""
    if not counts:
        return None
    return min(counts, key=lambda k: (-int(counts[k]), k))


#: the results-table columns an LlmFacts fills, in this order (``knobs`` is JSON, the rest scalars)
LLM_FACT_COLUMNS: tuple[str, ...] = tuple(LlmFacts.model_fields)
#: the integer ones among them
LLM_FACT_INTS: frozenset[str] = frozenset({"n_threads", "prefix_tokens", "workload_seed"})

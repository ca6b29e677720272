"""``farm submit``'s options for LLM servers over the OpenAI API (``schemas.llm.LlmSettings``), declared once,
and what they add to a request: ``measurement.llm`` and the endpoint reader that checks the server."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import typer

from farm.endpoint import Attach
from schemas import ProfileRequest
from schemas.llm import LLM_APIS
from workers.loadgen.llm_workload import load_workload

API = typer.Option(None, "--api", help=f"{' | '.join(LLM_APIS)}: profile an LLM server over the OpenAI API "
                   "(--endpoint http://HOST:PORT\\[/v1], --model-name NAME); streamed, TTFT/ITL/tokens per s.")
API_KEY_ENV = typer.Option(None, "--api-key-env", help="The environment variable that holds the API key (sent as a "
                           "bearer token; never stored).")
INPUT_TOKENS = typer.Option(None, "--input-tokens", help="Prompt tokens: N, MEAN/STDDEV or MIN:MAX (default 128).")
OUTPUT_TOKENS = typer.Option(None, "--output-tokens", help="Output tokens asked for (max_tokens): N, MEAN/STDDEV "
                             "or MIN:MAX (default 128).")
PREFIX_TOKENS = typer.Option(None, "--prefix-tokens", help="A prefix of N tokens shared by every prompt.")
SEED = typer.Option(None, "--seed", help="Seed of the synthetic prompts and lengths (same prompts every run).")
PROMPTS = typer.Option(None, "--prompts", help="Prompt file: JSONL ({\"prompt\": ...}) or ShareGPT JSON.")
TOKENIZER = typer.Option(None, "--tokenizer", help="Local Hugging Face tokenizer (folder or tokenizer.json): "
                         "exact prompt lengths, and token counts where the server sends no usage.")
SLO = typer.Option(None, "--slo", help="Latency goals for goodput, ms: ttft=MS,tpot=MS,e2e=MS (any of them).")
REQUESTS = typer.Option(None, "--requests", help="LLM jobs: measure this many requests (instead of the windows).")
WARMUP_REQUESTS = typer.Option(None, "--warmup-requests", help="LLM jobs: requests sent first and left out.")


def apply(data: dict[str, Any], **given: Any) -> dict[str, Any]:
    """``data`` (a request dict) with the options given on the command line in ``measurement.llm`` (over the
    request file's); unchanged when no LLM option was given. A path is made absolute."""
    opts = {k: v for k, v in given.items() if v is not None}
    if not opts:
        return data
    for key in ("prompts", "tokenizer"):
        if key in opts:
            opts[key] = str(Path(opts[key]).expanduser().resolve())
    measurement = dict(data.get("measurement") or {})
    measurement["llm"] = {**(measurement.get("llm") or {}), **opts}
    return {**data, "measurement": measurement}


def attach_for(request: ProfileRequest, fallback: Attach) -> Attach:
    """The endpoint reader of ``request``: the OpenAI API's for an LLM request (its workload checked first:
    a bad prompt file or tokenizer is a usage error at submit), else ``fallback`` (KServe v2)."""
    llm = request.measurement.llm
    if llm is None:
        return fallback
    if llm.prompts or llm.tokenizer:
        load_workload(llm)  # RequestError names the bad line or file
    if request.endpoint is None:  # an LLM engine farm launches: nothing runs yet to read
        return fallback
    from workers.serving.openai_api import attach_openai  # noqa: PLC0415 - the OpenAI client: LLM submits only
    return functools.partial(attach_openai, llm=llm)

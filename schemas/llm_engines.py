"""The LLM engines' knobs: the server settings farm sweeps as matrix dimensions (``--knob NAME=V1,V2``), named
per engine and checked here, before any job runs. A job carries its values in ``JobSpec.knobs``; each engine's
serving module (``workers/serving/``) turns them into its server's flags. A knob left out keeps the engine's
default, except ``n_threads``, which follows the job's core lease."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

KnobValue = int | float | bool | str
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class Knob:
    """One server setting of an engine: its type and bounds (``low``/``high`` inclusive) or choices."""

    name: str
    kind: Literal["int", "float", "bool", "choice"]
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.name} ({' | '.join(self.choices)})"
        if self.kind == "bool":
            return f"{self.name} (true | false)"
        if self.kind == "int":
            return f"{self.name} (int {int(self.low or 0)}..{int(self.high or 0)})"
        return f"{self.name} ({self.kind} {self.low:g}..{self.high:g})"

    def check(self, value: object) -> KnobValue:
        """``value`` (a request file's value or the text of ``--knob``) as this knob's type; ValueError saying
        what is allowed."""
        bad = ValueError(f"knob {self.describe()}: {value!r} is not allowed")
        if self.kind == "bool":
            return _bool(value, bad)
        if self.kind == "choice":
            if str(value) not in self.choices:
                raise bad
            return str(value)
        number = _number(value, self.kind, bad)
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise bad
        return number


def _bool(value: object, bad: ValueError) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise bad


def _number(value: object, kind: str, bad: ValueError) -> int | float:
    if isinstance(value, bool):
        raise bad
    try:
        number = float(value) if isinstance(value, str | int | float) else math.nan
    except ValueError:
        raise bad from None
    if not math.isfinite(number):
        raise bad
    if kind == "int":
        if number != int(number):
            raise bad
        return int(number)
    return number


N_THREADS = Knob("n_threads", "int", "CPU threads of the server (default: one per leased core)", 1, 256)
KNOBS: dict[str, dict[str, Knob]] = {
    "llama.cpp": {k.name: k for k in (
        Knob("n_parallel", "int", "slots: requests decoded together (llama-server; llama-cpp-python's server has "
             "one)", 1, 256),
        Knob("n_ctx", "int", "context length, tokens (shared by the slots)", 16, 1 << 20),
        N_THREADS,
        Knob("n_batch", "int", "prompt tokens processed per step", 1, 1 << 16),
    )},
    "transformers": {k.name: k for k in (
        Knob("dtype", "choice", "weights' dtype", choices=("auto", "float32", "bfloat16", "float16")),
        Knob("attn_implementation", "choice", "attention kernel",
             choices=("eager", "sdpa", "flex_attention", "flash_attention_2", "paged_attention")),
        Knob("max_batch_tokens", "int", "batch limit: tokens per step of continuous batching (turns it on)",
             1, 1 << 20),
        Knob("continuous_batching", "bool", "continuous batching with paged attention"),
        N_THREADS,
    )},
    "vllm": {k.name: k for k in (
        Knob("max_num_seqs", "int", "sequences decoded together", 1, 4096),
        Knob("max_num_batched_tokens", "int", "tokens per scheduler step", 1, 1 << 20),
        Knob("gpu_memory_utilization", "float", "share of the GPU's memory vLLM may take", 0.05, 1.0),
        Knob("enable_prefix_caching", "bool", "reuse the KV cache of shared prompt prefixes"),
    )},
}


def knob_help() -> str:
    """Every engine's knobs, one line each (for ``--knob``'s help and errors)."""
    return "; ".join(f"{engine}: {', '.join(k.describe() for k in knobs.values())}" for engine, knobs in KNOBS.items())


def check_knobs(engine: str, knobs: Mapping[str, object]) -> dict[str, KnobValue]:
    """``knobs`` checked for ``engine``, each value of its knob's type; ValueError naming an unknown knob (and
    the engine's own) or a bad value."""
    if not knobs:
        return {}
    own = KNOBS.get(engine)
    if own is None:
        raise ValueError(f"engine {engine} has no knobs (knobs are settings of the LLM engines: {', '.join(KNOBS)}); "
                         f"drop {', '.join(sorted(knobs))}")
    unknown = sorted(set(knobs) - set(own))
    if unknown:
        raise ValueError(f"engine {engine} has no knob {', '.join(unknown)}; its knobs: "
                         f"{', '.join(k.describe() for k in own.values())}")
    return {name: own[name].check(value) for name, value in knobs.items()}


def typed_knob(name: str, value: object) -> KnobValue:
    """``value`` as knob ``name``'s type (the first engine's knob of that name; ``n_threads`` is shared)."""
    for own in KNOBS.values():
        if name in own:
            return own[name].check(value)
    raise ValueError(f"no LLM engine has a knob {name}; the knobs: {knob_help()}")


def parse_knob(text: str) -> tuple[str, list[str]]:
    """``NAME=V1,V2`` (one ``--knob``) as (name, values); ValueError for any other shape."""
    name, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name.strip() or not items:
        raise ValueError(f"--knob {text!r} is not NAME=VALUE[,VALUE...] (e.g. n_parallel=1,4)")
    return name.strip(), items

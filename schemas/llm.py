"""The request side of profiling a generative (LLM) server over the OpenAI HTTP API: which API, the workload
(prompt and output lengths as fixed values or distributions, a shared prefix, a seed, or a prompt file), where
token counts come from (``tokenizer``), the latency goals (``slo``) and how many requests to measure.

A request carries it as ``measurement.llm`` (``MeasurementSettings.llm``), so every job of the request gets it
in its spec. ``None``: the job speaks KServe v2 as before. Token counts in tokens, times in ms.
"""
from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from schemas.specs import StrictModel

#: the APIs the OpenAI client speaks: /v1/chat/completions and /v1/completions, both streamed
LlmApi = Literal["openai-chat", "openai-completions"]
LLM_APIS: tuple[str, ...] = ("openai-chat", "openai-completions")
MAX_TOKENS = 1_000_000  # the longest prompt or output a request may ask for, tokens
#: what ``--slo`` accepts: key -> the field of :class:`Slo`
SLO_KEYS: dict[str, str] = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_NUM = r"(\d+(?:\.\d+)?)"
_FIXED_RE = re.compile(rf"^{_NUM}$")
_NORMAL_RE = re.compile(rf"^{_NUM}/{_NUM}$")
_UNIFORM_RE = re.compile(rf"^{_NUM}:{_NUM}$")


class TokenDist(StrictModel):
    """A token length: ``fixed`` N; ``normal`` mean/stddev (rounded, at least 1); ``uniform`` min:max
    (whole numbers, both ends included). Written ``128``, ``128/32`` or ``64:256``."""

    kind: Literal["fixed", "normal", "uniform"] = "fixed"
    a: float = Field(ge=0, le=MAX_TOKENS)
    b: float = Field(default=0.0, ge=0, le=MAX_TOKENS)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: object) -> object:
        if isinstance(data, bool):
            return data
        if isinstance(data, int | float):
            return {"kind": "fixed", "a": data}
        if isinstance(data, str):
            return parse_token_dist(data)
        return data

    @model_validator(mode="after")
    def _check(self) -> TokenDist:
        if self.kind == "uniform" and self.a > self.b:
            raise ValueError(f"token range {self.a:g}:{self.b:g} has min > max")
        if self.kind != "normal" and self.a != int(self.a):
            raise ValueError(f"token length {self.a:g} is not a whole number")
        return self

    def text(self) -> str:
        """The written form (``128``, ``128/32``, ``64:256``)."""
        return {"fixed": f"{self.a:g}", "normal": f"{self.a:g}/{self.b:g}", "uniform": f"{self.a:g}:{self.b:g}"}[
            self.kind]

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a


def parse_token_dist(text: str) -> dict[str, object]:
    """``128`` / ``128/32`` (mean/stddev) / ``64:256`` (min:max) as TokenDist fields; ValueError otherwise."""
    t = text.strip()
    for kind, pattern in (("fixed", _FIXED_RE), ("normal", _NORMAL_RE), ("uniform", _UNIFORM_RE)):
        m = pattern.match(t)
        if m:
            return {"kind": kind, "a": float(m.group(1)), **({"b": float(m.group(2))} if m.lastindex == 2 else {})}
    raise ValueError(f"token length {text!r} is not N, MEAN/STDDEV or MIN:MAX (e.g. 128, 128/32, 64:256)")


class Slo(StrictModel):
    """Latency goals a request must meet to count toward goodput (ms; None: no goal on that figure)."""

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: object) -> object:
        return parse_slo(data) if isinstance(data, str) else data

    def text(self) -> str:
        """The goals for humans: ``ttft<=200 ms, tpot<=50 ms``."""
        return ", ".join(f"{k}<={getattr(self, f):g} ms" for k, f in SLO_KEYS.items() if getattr(self, f) is not None)

    def met(self, ttft_ms: float, tpot_ms: float | None, e2e_ms: float) -> bool:
        """Whether one request's figures meet every goal (a one-token answer has no TPOT: that goal is met)."""
        return ((self.ttft_ms is None or ttft_ms <= self.ttft_ms)
                and (self.tpot_ms is None or tpot_ms is None or tpot_ms <= self.tpot_ms)
                and (self.e2e_ms is None or e2e_ms <= self.e2e_ms))


def parse_slo(text: str) -> dict[str, float]:
    """``ttft=200,tpot=50,e2e=5000`` (ms) as Slo fields; ValueError names an unknown key or a bad number."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"SLO item {part!r} is not KEY=MS with KEY one of {', '.join(SLO_KEYS)} "
                             "(e.g. ttft=200,tpot=50)")
        try:
            out[SLO_KEYS[key]] = float(value)
        except ValueError:
            raise ValueError(f"SLO item {part!r}: {value!r} is not a number of ms") from None
    if not out:
        raise ValueError("the SLO is empty; give e.g. ttft=200,tpot=50,e2e=5000 (ms)")
    return out


class LlmSettings(StrictModel):
    """How an LLM job is driven (see the module docstring). ``base_path``: the API's path on the server
    (``/v1``); ``tls``: https. ``requests``: measured requests (None: the measurement's windows);
    ``warmup_requests``: requests sent and left out before measuring (with ``warmup_s``)."""

    api: LlmApi = "openai-chat"
    base_path: str = Field(default="/v1", max_length=300)
    tls: bool = False
    api_key_env: str | None = Field(default=None, description="the environment variable holding the API key "
                                    "(read by the client, never stored)")
    input_tokens: TokenDist = Field(default_factory=lambda: TokenDist(a=128))
    output_tokens: TokenDist = Field(default_factory=lambda: TokenDist(a=128))
    prefix_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS, description="a prefix shared by every prompt, "
                               "in front of its own input_tokens")
    seed: int = Field(default=0, ge=0)
    prompts: str | None = Field(default=None, max_length=4096, description="JSONL or ShareGPT JSON prompt file")
    tokenizer: str | None = Field(default=None, max_length=4096,
                                  description="a local Hugging Face tokenizer folder or tokenizer.json")
    slo: Slo | None = None
    requests: int | None = Field(default=None, ge=1, le=10_000_000)
    warmup_requests: int = Field(default=0, ge=0, le=1_000_000)
    request_timeout_s: float = Field(default=600.0, gt=0, le=86400)

    def base_url(self, hostport: str) -> str:
        """``http(s)://HOST:PORT/v1`` of the server at ``hostport``, with this scheme and path."""
        return f"{'https' if self.tls else 'http'}://{hostport}{self.base_path}"

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_RE.match(v):
            raise ValueError(f"api_key_env {v!r} is not an environment variable name (letters, digits, _)")
        return v

    @field_validator("base_path")
    @classmethod
    def _path(cls, v: str) -> str:
        v = "/" + v.strip("/")
        if any(c in v for c in " ?#\x00"):
            raise ValueError(f"base_path {v!r} is not a URL path like /v1")
        return v


def split_endpoint(url: str) -> tuple[str, str, bool]:
    """``http://HOST:PORT[/PATH]`` as (``HOST:PORT``, the API path (``/v1`` when none), https?);
    ValueError for anything else."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"endpoint {url!r} is not http://HOST:PORT[/PATH] (e.g. http://127.0.0.1:8000/v1)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"endpoint {url!r} has a bad port") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    path = parts.path.rstrip("/") or "/v1"
    return f"{host}:{port}", path, parts.scheme == "https"

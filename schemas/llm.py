"""The request side of profiling a generative (LLM) server over the OpenAI HTTP API: which API, the workload
(prompt and output lengths as fixed values or distributions, a shared prefix, a seed, or a prompt file), where
token counts come from (``tokenizer``), the latency goals (``slo``), how many requests to measure and the
operator's credential an endpoint's key comes from (``credential``).

A request carries it as ``measurement.llm`` (``MeasurementSettings.llm``), so every job of the request gets it
in its spec. ``None``: the job speaks KServe v2 as before. Token counts in tokens, times in ms.

Files a request brings (prompt, trace and tokenizer files) travel as :class:`FileRef`: at submit a path on the
submitter's disk, read (size-capped), stored content-addressed like a model (``farm.artifacts``) and replaced by
its reference; a worker reads only the stored bytes, never a path of its own disk.
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
MAX_TURNS = 1000  # the most turns a synthetic session may have
#: what ``--slo`` accepts: key -> the field of :class:`Slo`
SLO_KEYS: dict[str, str] = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
_CREDENTIAL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SHA_RE = r"^[0-9a-f]{64}$"
_FILENAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$"
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

    def upper(self) -> int:
        """The largest length a draw gives (a normal draw is cut at mean + 4 stddev: ``workload._draw``)."""
        return int(self.b if self.kind == "uniform" else self.a + 4 * self.b if self.kind == "normal" else self.a)


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


#: the kinds of file an LLM workload brings (:meth:`LlmSettings.files`)
WorkloadKind = Literal["prompts", "trace", "tokenizer"]


class FileRef(StrictModel):
    """A file uploaded with the request (``kind``: prompts, a trace or a tokenizer), stored content-addressed like a
    model: its sha256, the name it is cached under (a folder: ``NAME.tar``), its size in bytes and what the
    submitter called it (``label``, shown in results; never opened)."""

    kind: WorkloadKind
    sha256: str = Field(pattern=_SHA_RE)
    filename: str = Field(pattern=_FILENAME_RE)
    size_bytes: int = Field(ge=0)
    label: str = Field(default="", max_length=4096)


def file_label(ref: str | FileRef | None) -> str | None:
    """How results name a workload file: the submitter's name for it and its sha256's first 12 characters (a path
    not uploaded yet: itself)."""
    if ref is None or isinstance(ref, str):
        return ref
    return f"{ref.label or ref.filename} (sha256 {ref.sha256[:12]})"


#: the artifact format a workload file is stored under (``farm.artifacts``), by its kind
WORKLOAD_FORMATS: dict[str, str] = {"prompts": "llm-prompts", "trace": "llm-trace", "tokenizer": "llm-tokenizer"}
WorkloadFile = str | FileRef  # a path at submit (read and uploaded there), a stored file's reference after


class LlmSettings(StrictModel):
    """How an LLM job is driven (see the module docstring). ``base_path``: the API's path on the server
    (``/v1``); ``tls``: https. ``requests``: measured requests (None: the measurement's windows);
    ``warmup_requests``: requests sent and left out before measuring (with ``warmup_s``)."""

    api: LlmApi = "openai-chat"
    base_path: str = Field(default="/v1", max_length=300)
    tls: bool = False
    credential: str | None = Field(default=None, description="the name of an endpoint credential the workers' "
                                   "operator set up (FARM_ENDPOINT_CREDENTIALS): its value is sent as the bearer "
                                   "token, never stored")
    input_tokens: TokenDist = Field(default_factory=lambda: TokenDist(a=128))
    output_tokens: TokenDist = Field(default_factory=lambda: TokenDist(a=128))
    prefix_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS, description="a prefix shared by every prompt, "
                               "in front of its own input_tokens")
    seed: int = Field(default=0, ge=0)
    prompts: WorkloadFile | None = Field(default=None, description="JSONL or ShareGPT JSON prompt file (uploaded "
                                         "with the request)")
    trace: WorkloadFile | None = Field(default=None, description="a request trace replayed on its own schedule "
                                       "(Mooncake JSONL, BurstGPT or Azure CSV; uploaded with the request)")
    trace_speed: float = Field(default=1.0, gt=0, le=1000, description="the trace's time scale: its gaps divided "
                               "by this (2: twice as fast)")
    trace_tokens: float = Field(default=1.0, gt=0, le=16, description="the trace's token scale: every length "
                                "and its hash ids' block size times this")
    trace_limit: int | None = Field(default=None, ge=1, le=10_000_000, description="replay the trace's first N "
                                    "requests only")
    sessions: int | Literal["sharegpt"] | None = Field(default=None, description="multi-turn conversations, each "
                                                   "turn sent with its history: N synthetic turns of input_tokens "
                                                   "each (their outputs output_tokens), or sharegpt: the prompt "
                                                   "file's conversations replayed whole; the load level then counts "
                                                   "sessions (in flight, or arriving per s)")
    think_ms: float = Field(default=0.0, ge=0, le=3_600_000, description="sessions: the user's think time between "
                            "a turn's answer and the next turn, ms")
    tokenizer: WorkloadFile | None = Field(default=None, description="a Hugging Face tokenizer.json or its folder "
                                           "(uploaded with the request, parsed only in the sandbox)")
    slo: Slo | None = None
    requests: int | None = Field(default=None, ge=1, le=10_000_000)
    warmup_requests: int = Field(default=0, ge=0, le=1_000_000)
    request_timeout_s: float = Field(default=600.0, gt=0, le=86400)

    def base_url(self, hostport: str) -> str:
        """``http(s)://HOST:PORT/v1`` of the server at ``hostport``, with this scheme and path."""
        return f"{'https' if self.tls else 'http'}://{hostport}{self.base_path}"

    @model_validator(mode="before")
    @classmethod
    def _no_env_names(cls, data: object) -> object:
        if isinstance(data, dict) and "api_key_env" in data:
            raise ValueError("api_key_env is gone: a request names an operator's endpoint credential instead "
                             "(credential, --credential NAME; docs/security.md)")
        return data

    @field_validator("credential")
    @classmethod
    def _credential(cls, v: str | None) -> str | None:
        if v is not None and not _CREDENTIAL_RE.match(v):
            raise ValueError(f"credential {v!r} is not a credential name (letters, digits, _.-, at most 64)")
        return v

    @field_validator("prompts", "trace", "tokenizer")
    @classmethod
    def _file_path(cls, v: WorkloadFile | None) -> WorkloadFile | None:
        if isinstance(v, str) and (not v.strip() or len(v) > 4096 or "\x00" in v):
            raise ValueError(f"{v[:60]!r} is not a file path")
        return v

    @field_validator("sessions", mode="before")
    @classmethod
    def _sessions(cls, v: object) -> object:
        """``--sessions`` as written: a number of turns or ``sharegpt``."""
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v.strip())
        if isinstance(v, int) and not isinstance(v, bool) and not 1 <= v <= MAX_TURNS:
            raise ValueError(f"--sessions {v}: a session has 1 to {MAX_TURNS} turns")
        if isinstance(v, str) and v.strip() != "sharegpt":
            raise ValueError(f"--sessions {v!r} is not a number of turns or sharegpt")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> LlmSettings:
        if self.trace is not None and self.prompts is not None:
            raise ValueError("--trace and --prompts both say what to send: give one of them")
        self._check_sessions()
        return self

    def _check_sessions(self) -> None:
        """Sessions: synthetic turns without a prompt file, ``sharegpt`` with one; think time only with sessions."""
        if self.think_ms and self.sessions is None:
            raise ValueError("--think-ms is the time between a session's turns: add --sessions N|sharegpt")
        if self.sessions is None:
            return
        if self.trace is not None:
            raise ValueError("--trace and --sessions both say what to send: give one of them")
        if self.sessions == "sharegpt" and self.prompts is None:
            raise ValueError("--sessions sharegpt replays a ShareGPT file's conversations: give --prompts FILE")
        if isinstance(self.sessions, int) and self.prompts is not None:
            raise ValueError(f"--sessions {self.sessions} builds synthetic conversations; to replay --prompts' "
                             "conversations give --sessions sharegpt")

    def files(self) -> dict[str, WorkloadFile]:
        """The files the workload names, by field (``prompts``, ``trace``, ``tokenizer``)."""
        return {k: v for k, v in (("prompts", self.prompts), ("trace", self.trace), ("tokenizer", self.tokenizer))
                if v is not None}

    def prompt_tokens_max(self) -> int:
        """The most tokens one synthetic prompt may hold: the shared prefix and the largest input draw (a normal
        draw is cut at mean + 4 stddev); in a synthetic session, its last turn's: every turn's input and every earlier
        answer (its history)."""
        turns = self.sessions if isinstance(self.sessions, int) else 1
        return self.prefix_tokens + turns * self.input_tokens.upper() + (turns - 1) * self.output_tokens.upper()

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

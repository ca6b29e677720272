"""An engine knob: one server setting farm sweeps as a matrix dimension (``--knob NAME=V1,V2``), its type and
bounds, and the checks that turn a request's value into that type. Which engine has which knobs is its card's
(``schemas.engines.CARDS``); ``schemas.llm_engines`` checks a job's knobs against them."""
from __future__ import annotations

import math
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


#: the knob every CPU LLM engine shares: a knob left out keeps the engine's default, except this one, which
#: follows the job's core lease
N_THREADS = Knob("n_threads", "int", "CPU threads of the server (default: one per leased core)", 1, 256)


def parse_knob(text: str) -> tuple[str, list[str]]:
    """``NAME=V1,V2`` (one ``--knob``) as (name, values); ValueError for any other shape."""
    name, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name.strip() or not items:
        raise ValueError(f"--knob {text!r} is not NAME=VALUE[,VALUE...] (e.g. n_parallel=1,4)")
    return name.strip(), items

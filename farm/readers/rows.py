"""A results row: one job (or a cell's merged repeats) as ``farm.readers.results`` returns it.

A :class:`ResultRow` is the dict ``farm results --json`` prints, export writes and the reports read (its keys:
``results.JOB_COLUMNS``, the measurement and placement columns, the metrics, ...), so what is stored and
printed stays the same; its properties are the typed reads of the fields every reader uses."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from schemas.engines import Protocol, is_openai
from schemas.job import JobStatus
from schemas.llm_facts import LLM_FACT_COLUMNS, LlmFacts

#: the status of a merged row whose repeats ended differently (``results.merge_repeats``)
MIXED = "mixed"


class ResultRow(dict[str, Any]):
    """One results row (a dict: its keys are the columns). ``status``: a ``JobStatus`` value, or ``mixed``
    for merged repeats that ended differently."""

    @property
    def job_id(self) -> str:
        return str(self["job_id"])

    @property
    def status(self) -> str:
        return str(self["status"])

    @property
    def succeeded(self) -> bool:
        """Whether the job (every merged repeat) succeeded."""
        return self.get("status") == JobStatus.succeeded

    @property
    def device(self) -> str:
        return str(self["device"])

    @property
    def engine(self) -> str:
        return str(self["engine"])

    @property
    def rate(self) -> float | None:
        """The open-loop rate, requests/s (None: closed loop)."""
        rate = self.get("rate")
        return None if rate is None else float(rate)

    @property
    def protocol(self) -> Protocol:
        """The protocol the job spoke (``JobSpec.protocol``, the one answer to "an LLM job?"): the row's column;
        a row without it (built by hand, read from an older export): OpenAI where it holds LLM metrics or its
        engine's card says so."""
        given = self.get("protocol")
        if given in ("kserve", "openai"):
            return "openai" if given == "openai" else "kserve"
        llm = self.get("output_tokens_per_s") is not None or is_openai(str(self.get("engine")))
        return "openai" if llm else "kserve"

    @property
    def edge_profile(self) -> str | None:
        """The edge profile's name (None: a serving run)."""
        return self.get("edge_profile")

    @property
    def is_edge(self) -> bool:
        return bool(self.get("edge_profile"))

    @property
    def error(self) -> str | None:
        return self.get("error")

    @property
    def llm(self) -> LlmFacts | None:
        """An LLM job's facts (``schemas.llm_facts``: knobs, token source, workload), typed as stored (not checked
        again); None for a job that is not an LLM one (no knobs and no workload)."""
        if self.get("knobs") is None and self.get("output_tokens") is None:
            return None
        return LlmFacts.model_construct(**{c: self.get(c) for c in LLM_FACT_COLUMNS})


def as_row(row: Mapping[str, Any]) -> ResultRow:
    """``row`` as a :class:`ResultRow` (a row read back from JSON, or built by hand, is a plain dict)."""
    return row if isinstance(row, ResultRow) else ResultRow(row)


def as_rows(rows: Iterable[Mapping[str, Any]]) -> list[ResultRow]:
    """``rows`` as :class:`ResultRow` (:func:`as_row`)."""
    return [as_row(r) for r in rows]

"""How a result row was measured, in words (the ``measured`` column of results, exports and the
``job_results`` view): a serving job end to end through a gRPC client, an edge job inside its container
with no transport, so an edge row's throughput is not comparable to a serving one. The one wording."""
from __future__ import annotations

#: a serving row, in short (table cells) and in full; ``{rpc}``: unary or stream
SERVING_SHORT = "end-to-end over gRPC"
MEASURED_SERVING = SERVING_SHORT + " ({rpc} calls: client, network stack, server)"
#: an LLM row (the OpenAI client's ``rpc``: server-sent events over HTTP)
LLM_RPC = "sse"
MEASURED_LLM = "end-to-end over HTTP (OpenAI API, streamed as server-sent events: client, network stack, server)"
#: an edge row, in short and in full
EDGE_SHORT = "in-process"
MEASURED_EDGE = EDGE_SHORT + " on the edge profile (no server, no transport)"
#: an LLM engine's edge row: its server held to the profile's limits, driven over HTTP like a serving row
MEASURED_LLM_EDGE = ("end-to-end over HTTP (OpenAI API, server-sent events) to an LLM server held to the edge "
                     "profile's CPU and memory limits")


def how_measured(edge: bool, rpc: str | None = None) -> str:
    """The ``measured`` text of a row: an edge run, an LLM job (``rpc`` sse) or a serving job over ``rpc``
    calls (default unary)."""
    if edge:
        return MEASURED_LLM_EDGE if rpc == LLM_RPC else MEASURED_EDGE
    return MEASURED_LLM if rpc == LLM_RPC else MEASURED_SERVING.format(rpc=rpc or "unary")


def how_measured_short(edge: bool) -> str:
    """The same in a few words, for a table column."""
    return EDGE_SHORT if edge else SERVING_SHORT

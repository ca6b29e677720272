"""The prompts and send schedule of a trace replay (``--trace``, ``farm.traces``): one prompt per trace row, in its
order, and the row's send offsets for the job's ``TraceReplay`` pattern.

A prompt is its row's blocks of ``block_tokens`` tokens (512 at token scale 1), the last one cut to the row's
length. A block with a hash id is the text drawn from the job's seed and that id, the same wherever the id appears,
so rows that share leading ids share exactly that prefix (the prefix sharing the trace recorded) and different ids
give different text; the blocks past a row's hash ids, and every block of a row without any, are drawn from the
row's own line (unique content). Text is drawn as the synthetic prompts are (``workload``): with a tokenizer each
block is cut to its exact token count, without one a word stands for a token.

Blocks are cut in context: every block begins with a space (the one that joins it to the block before; the
prompt's first too, so that a hash id's block is the same text wherever it stands) and is cut to its token count
with that space, so that block ``j`` of a prompt begins at token ``j * block_tokens`` as the server counts
(tokenizers that split words at spaces, as byte-level BPE and word-level ones do, never merge across it). Cut
alone and joined by a space, blocks drifted by a token here and there (32, 65, 96, 129 ... with the tiny-llama
example's BPE): a server's prefix cache, which reuses whole blocks of its own (vLLM: 16 or 32 tokens), then missed
a block the trace shares, and a prompt was a token off its row's length.
"""
from __future__ import annotations

import math
import random
from pathlib import Path

from farm import traces
from farm.settings import get_settings
from farm.workload_files import local_files
from schemas.llm import LlmSettings, file_label
from workers.loadgen.openai.workload import Counting, Prompt, _synthetic
from workers.loadgen.patterns import LoadPattern, TraceReplay


def block_key(seed: int, row: traces.TraceRow, j: int) -> str:
    """The seed of block ``j`` of ``row``'s prompt: its hash id's where it has one, else the row's own."""
    return f"{seed}:h{row.hash_ids[j]}" if j < len(row.hash_ids) else f"{seed}:r{row.line}:{j}"


def _block(key: str, n: int, tok: Counting | None) -> str:
    """The text of a block of ``n`` tokens drawn from ``key`` (the same for the same key): a space, then text, ``n``
    tokens with that space by the tokenizer (where it does not keep a leading space through a cut: the block as
    drawn after a space), ``n`` words without one."""
    if tok is None:
        return " " + _synthetic(random.Random(key), n, tok)[0]
    text = tok.cut(" " + _synthetic(random.Random(key), n + 2, tok)[0], n)
    return text if text.startswith(" ") else " " + _synthetic(random.Random(key), n, tok)[0]


def _cut(text: str, n: int, tok: Counting | None) -> str:
    """``text`` (a block: a space, then text) to its first ``n`` tokens (words without a tokenizer), its leading
    space kept (a tokenizer whose cut drops it counts no token for it)."""
    if tok is None:
        return " " + " ".join(text.split()[:n])
    cut = tok.cut(text, n)
    return cut if cut.startswith(" ") else " " + cut


class Builder:
    """Builds rows' prompts from blocks of ``block_tokens``, the shared (hash id) blocks built once."""

    def __init__(self, block_tokens: int, seed: int, tok: Counting | None) -> None:
        self.block_tokens, self.seed, self.tok = block_tokens, seed, tok
        self.shared: dict[str, str] = {}

    def blocks(self, row: traces.TraceRow) -> list[str]:
        """The texts of ``row``'s blocks (each led by a space), in order, the last cut to the row's length."""
        bs, n = self.block_tokens, row.input_tokens
        out = []
        for j in range(math.ceil(n / bs)):
            key = block_key(self.seed, row, j)
            if j < len(row.hash_ids):
                if key not in self.shared:
                    self.shared[key] = _block(key, bs, self.tok)
                text = self.shared[key]
            else:
                text = _block(key, bs, self.tok)
            size = min(bs, n - j * bs)
            out.append(text if size == bs else _cut(text, size, self.tok))
        return out

    def prompt(self, row: traces.TraceRow) -> Prompt:
        text = "".join(self.blocks(row))
        if self.tok is None:
            return Prompt(text, row.input_tokens, "words", row.output_tokens)
        return Prompt(text, self.tok.count(text), "tokenizer", row.output_tokens)


def read_trace(llm: LlmSettings, path: Path) -> traces.Trace:
    """The request's trace at ``path`` (its upload), scaled and limited as the request says and checked against
    this host's caps (RequestError, one line)."""
    label = str(file_label(llm.trace) or path)
    s = get_settings()
    trace = traces.read(path, label, llm.trace_tokens, llm.trace_limit, s.max_workload_file_bytes)
    traces.check(trace, label, None, s.max_prompt_tokens, llm.trace_tokens)
    return trace


def trace_prompts(llm: LlmSettings, path: Path, tok: Counting | None) -> list[Prompt]:
    """One prompt per row of the request's trace at ``path``, in the trace's order."""
    trace = read_trace(llm, path)
    build = Builder(trace.block_tokens, llm.seed, tok)
    return [build.prompt(r) for r in trace.rows]


def replay_pattern(pattern: LoadPattern, llm: LlmSettings) -> LoadPattern:
    """``pattern`` given its trace's schedule where it replays one (a ``TraceReplay``), else as it is."""
    if not isinstance(pattern, TraceReplay):
        return pattern
    with local_files(llm, submitting=False) as files:
        return pattern.with_offsets(read_trace(llm, files["trace"]).offsets_s(llm.trace_speed))

"""Is the workload the server sees the one farm asked (issue 41 point 1)? farm's synthetic prompts, built as a job
builds them, sent to llama-cpp-python's server on the tiny random GGUF (``tests.llm_servers``), each salted as the
load loop salts it and sent unstreamed so that the server's ``usage`` gives its own prompt and output counts.

Two ways to cut the prompts: by the server's own tokenizer (``server_tokenizer``, what a job does where the server
has a tokenize route) and by words (a word standing for a token: what a job does without one); and chat prompts
cut by the server's tokenizer less the chat template's tokens, measured on the probe request (``request.probe``).
For each input length: the tokens asked, the server's mean and range over the prompts, the gap in %, and whether two
salted requests of one prompt share a leading token by the server's tokenizer.

Run: ``python benchmarks/llm_workload_as_asked.py [--prompts N] [--quick]`` (``--quick``: 2 prompts of 24 and 128
tokens, CI's smoke run). Prints a Markdown table; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import _serve  # noqa: F401, I001 (sets sys.path: tests.llm_servers lives in the checkout, not the installed package)

from schemas.engines import SERVED_MODEL_NAME
from schemas.llm import LlmSettings
from tests.llm_servers import llama_cpp_server, tiny_llama
from workers.loadgen.openai.http_once import exchange
from workers.loadgen.openai.request import PROBE_TEXT, probe, request_body
from workers.loadgen.openai.server_tokenizer import ServerTokenizer, server_tokenizer
from workers.loadgen.openai.workload import Counting, Framed, Salts, synthetic_prompts

LENGTHS = (24, 128, 256)
OUT = 8


def _server_counts(url: str, tok: Counting | None, n_in: int, prompts: int,
                   api: str = "openai-completions") -> tuple[list[int], list[int]]:
    """The server's prompt and completion counts of ``prompts`` prompts of ``n_in`` tokens cut by ``tok``."""
    salts = Salts.of(tok).started()
    got_in, got_out = [], []
    path = "/chat/completions" if api == "openai-chat" else "/completions"
    for k, p in enumerate(synthetic_prompts(LlmSettings(input_tokens=n_in, output_tokens=OUT), tok, prompts)):
        body = json.loads(request_body(api, SERVED_MODEL_NAME, p, True, salts.salt(k)))
        status, raw = exchange(f"{url}{path}", method="POST", body=json.dumps({**body, "stream": False}).encode(),
                               headers={"Content-Type": "application/json"}, timeout_s=300)
        usage = json.loads(raw)["usage"] if status == 200 else {}
        got_in.append(int(usage.get("prompt_tokens", -1)))
        got_out.append(int(usage.get("completion_tokens", -1)))
    return got_in, got_out


def _shares_prefix(tok: ServerTokenizer, n_in: int) -> bool:
    """Whether two salted requests of one prompt begin with the same token (after the specials)."""
    (p,) = synthetic_prompts(LlmSettings(input_tokens=n_in, output_tokens=OUT), tok, 1)
    salts = Salts.of(tok).started()
    a, b = (tok.ids(p.salted(salts.salt(k)), special=True)[tok.specials():] for k in (1, 2))
    return a[:1] == b[:1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per length and way")
    ap.add_argument("--quick", action="store_true", help="2 prompts of 24 and 128 tokens (a smoke run)")
    args = ap.parse_args()
    prompts, lengths = (2, LENGTHS[:2]) if args.quick else (args.prompts, LENGTHS)
    with tempfile.TemporaryDirectory(prefix="farm-asked-") as tmp:
        model = tiny_llama(Path(tmp))
        with llama_cpp_server(model.gguf) as url:
            tok = server_tokenizer(url.removesuffix("/v1"), SERVED_MODEL_NAME)
            assert tok is not None, "llama-cpp-python's server has no tokenize route"
            print("| cut by | asked | server's prompt tokens (mean, min-max) | off % | outputs (asked 8) "
                  "| salted pair shares a first token |")
            print("| --- | --- | --- | --- | --- | --- |")
            said = probe(url, "openai-chat", SERVED_MODEL_NAME, None, None)
            assert said.prompt_tokens is not None, "the chat probe got no usage"
            framed = Framed(tok, said.prompt_tokens - tok.count(PROBE_TEXT))  # the chat template's tokens
            ways: tuple[tuple[str, Counting | None, str], ...] = (
                ("server /extras/tokenize", tok, "openai-completions"), ("words", None, "openai-completions"),
                ("server /extras/tokenize, chat", framed, "openai-chat"))
            for n in lengths:
                for name, cutter, api in ways:
                    got, out = _server_counts(url, cutter, n, prompts, api)
                    mean = statistics.fmean(got)
                    shares = _shares_prefix(tok, n) if cutter is tok else "-"
                    name = f"{name} (template {framed.extra})" if cutter is framed else name
                    print(f"| {name} | {n} | {mean:.1f} ({min(got)}-{max(got)}) | {(mean / n - 1) * 100:+.1f} "
                          f"| {statistics.fmean(out):.1f} | {shares} |")


if __name__ == "__main__":
    main()

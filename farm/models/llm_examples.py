"""The ``tiny-llama`` example: a tiny random-weight Llama written offline (no model hub) in the two forms farm's
LLM engines load, with the same weights and the same tokenizer, so that llama.cpp and transformers count the
same tokens and (greedy) generate the same text.

- ``tiny-llama.gguf``: one GGUF file (``gguf`` package), F32 tensors, ``general.architecture = llama``;
  its tokenizer is ``tokenizer.ggml.model = gpt2`` (byte-level BPE) with pre-tokenizer ``gpt-2``, the token
  list, token types, merges, bos/eos ids and a chat template.
- ``tiny-llama-hf/``: a Hugging Face folder (``config.json`` of a ``LlamaForCausalLM``, ``model.safetensors``,
  ``tokenizer.json``, ``tokenizer_config.json`` with the same chat template, ``generation_config.json``).

Sized for a 2-core CI host (``TINY``): 2 layers, hidden 64, 2 heads of 32 (1 key/value head), FFN 128, a vocabulary
of about ``VOCAB_SIZE`` tokens (a byte-level BPE trained with the ``tokenizers`` package on ``CORPUS`` below),
context 2048. Deterministic: the same bytes on every run (seeded weights, a fixed corpus, F32). A larger
``LlamaShape`` (``SMALL``: 12 layers, hidden 256) makes a server whose time goes to the model rather than to
its own per-token overhead, as a real model's does (the benchmarks that compare load clients use it). Every
engine here serves both: vLLM's CPU attention takes head sizes of 32, 64, 128 (never 16), so heads are 32 wide.

Random weights would emit any token, among them single bytes of multi-byte UTF-8 characters (text that
does not decode), control characters and the special tokens (an end of sequence stops a stream early).
Servers handle those badly (slow or failing detokenization), and a stream that stops early measures
nothing. So every such token is made unreachable in the output: hidden dimension 0 of the residual stream
is held at a constant (``GUARD``: every embedding has it, and no attention or MLP output writes to it),
so after the final RMSNorm it is a positive number at every position; the output rows of the unwanted
tokens are ``-BAD_LOGIT`` in that dimension and zero elsewhere, the other rows 0 in it. Their logits are
about ``-BAD_LOGIT`` while the ordinary tokens' are within a few units of 0: the model emits printable
ASCII tokens only and runs to ``max_tokens``. They stay ordinary inputs.

Needs the ``llm`` extra (``pip install 'farm[llm]'``: gguf, tokenizers, safetensors).
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import RequestError

SEED = 0
VOCAB_SIZE = 1024
CONTEXT = 2048
ROPE_THETA = 10000.0
RMS_EPS = 1e-5
GUARD = 1.0  # residual dimension 0, constant at every position
BAD_LOGIT = 30.0  # how far below the ordinary tokens the unwanted ones are held
BOS, EOS, UNK = "<s>", "</s>", "<unk>"
SPECIALS = (BOS, EOS, UNK)
GGUF_NAME = "tiny-llama.gguf"
HF_NAME = "tiny-llama-hf"
#: a plain chat template, the same in both forms (Jinja2, as both servers render it)
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")

# the tokenizer's training text (shipped in the code: no data set is downloaded)
CORPUS = """\
A profiling farm measures how fast a model serves requests on each device, engine and setting. It sends load
at a fixed concurrency or at a steady rate, times every request, and keeps the figures in a database. The
engineer who asks wants to know which batch size, which number of threads and which server give the best
throughput while the latency stays under the budget, and whether the model still fits a small edge box with
one core and half a gigabyte of memory. Generative servers answer with a stream of tokens: the time to the
first token, the time between tokens and the tokens per second are what people read first. A server that
queues requests shows it in the first token; a server that batches well keeps the time between tokens low
while the load grows. The numbers must be honest: the client must not hide queueing, the clock must be one
clock, and the token counts must come from the server or from the same tokenizer the server uses.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick
daft zebras jump! Sphinx of black quartz, judge my vow. The five boxing wizards jump quickly.
In the morning the workers start, read their queue, claim a job, lease their cores, start the server, wait
until it is ready, send the load, sample the memory and the processor, write the result and stop the server.
When a worker dies its jobs go back to the queue; when the database is down the results wait on disk.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 100 128 256 512 1000 1024 2048 4096 65536 3.14 2.71 0.5 99.9 %.
Punctuation and code: (a, b) [c; d] {e: f} x = y + z * 2 - 1 / 3; if x > 0 and y < 1: return "ok" # done
def main(argv): print('hello world'); return 0  <tag attr="value"/> path/to/file.txt key=value a_b-c.
"""


@dataclass(frozen=True)
class LlamaShape:
    """The model's size: residual width, blocks, attention heads (query and key/value) and MLP width."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


TINY = LlamaShape(hidden=64, layers=2, heads=2, kv_heads=1, ffn=128)  # ~1,500 tokens/s on one core (llama.cpp)
SMALL = LlamaShape(hidden=256, layers=12, heads=8, kv_heads=4, ffn=768)  # ~5 ms a token on one core, 39 MB F32
SHAPES = {"tiny": TINY, "small": SMALL}
#: GGUF-only shapes of real size (``write_large_gguf``): 2.16 GB (3 layers, hidden 4096, F32) and 302 MB
LARGE = LlamaShape(hidden=4096, layers=3, heads=32, kv_heads=8, ffn=11008)
MEDIUM = LlamaShape(hidden=2048, layers=2, heads=16, kv_heads=4, ffn=4096)


@dataclass(frozen=True)
class TinyLlama:
    """The two forms written by :func:`build_tiny_llama`: the GGUF file and the Hugging Face folder."""

    gguf: Path
    hf: Path


def _modules() -> tuple[Any, Any, Any]:
    """(gguf, tokenizers, safetensors.numpy): the ``llm`` extra, imported when a tiny model is written."""
    try:
        import gguf  # noqa: PLC0415 - the optional llm extra, needed only to write this example
        import safetensors.numpy as st  # noqa: PLC0415 - idem
        import tokenizers  # noqa: PLC0415 - idem
    except ImportError as exc:
        raise RequestError(f"the tiny-llama example needs the llm extra ({exc.name} is missing): "
                           "pip install 'farm[llm]'") from None
    return gguf, tokenizers, st


def train_tokenizer() -> Any:
    """A byte-level BPE (GPT-2 pre-tokenization, no prefix space) trained on ``CORPUS``: a
    ``tokenizers.Tokenizer`` whose first ids are the special tokens."""
    _, tk, _ = _modules()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, show_progress=False,
                                     special_tokens=list(SPECIALS),
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return tok


def _vocab(tok: Any) -> tuple[list[str], list[str]]:
    """(tokens by id, merges as ``"a b"``) of the trained tokenizer."""
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def ordinary(tok: Any, n_vocab: int) -> np.ndarray:
    """A mask of the tokens the model may emit: not special, decoding to printable ASCII only."""
    mask = np.zeros(n_vocab, dtype=bool)
    for i in range(n_vocab):
        if tok.id_to_token(i) in SPECIALS:
            continue
        text = tok.decode([i], skip_special_tokens=False)
        mask[i] = bool(text) and all(" " <= c <= "~" for c in text)
    return mask


#: one tensor of the model: Hugging Face name, dimensions, spread of its normal draw (None: ones), an in-place edit
Tensor = tuple[str, tuple[int, ...], float | None, Callable[[np.ndarray], None] | None]


def _plan(n_vocab: int, allowed: np.ndarray, shape: LlamaShape = TINY) -> list[Tensor]:
    """The model's tensors in the order they are drawn (F32, seeded by ``_tensors``); residual dimension 0
    guarded. A wider shape's matrices have their spread scaled by 1/sqrt(width) from ``TINY``'s (so ``TINY``'s
    bytes stay the same), which keeps the activations, and with them the guard, as ``TINY``'s."""
    hidden, ffn, heads, kv_heads, head_dim = shape.hidden, shape.ffn, shape.heads, shape.kv_heads, shape.head_dim
    wide, deep = (TINY.hidden / hidden) ** 0.5, (TINY.ffn / ffn) ** 0.5

    def guard(emb: np.ndarray) -> None:
        emb[:, 0] = GUARD

    def unwritten(out: np.ndarray) -> None:
        out[0] = 0.0  # nothing writes to the guarded dimension

    def head(out: np.ndarray) -> None:
        out[:, 0] = 0.0
        out[~allowed] = 0.0
        out[~allowed, 0] = -BAD_LOGIT

    plan: list[Tensor] = [("model.embed_tokens.weight", (n_vocab, hidden), 1.0, guard)]
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        plan += [(p + "input_layernorm.weight", (hidden,), None, None),
                 (p + "post_attention_layernorm.weight", (hidden,), None, None),
                 (p + "self_attn.q_proj.weight", (heads * head_dim, hidden), 0.2 * wide, None),
                 (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden), 0.2 * wide, None),
                 (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden), 0.2 * wide, None),
                 (p + "self_attn.o_proj.weight", (hidden, heads * head_dim), 0.05 * wide, unwritten),
                 (p + "mlp.gate_proj.weight", (ffn, hidden), 0.2 * wide, None),
                 (p + "mlp.up_proj.weight", (ffn, hidden), 0.2 * wide, None),
                 (p + "mlp.down_proj.weight", (hidden, ffn), 0.05 * deep, unwritten)]
    return [*plan, ("model.norm.weight", (hidden,), None, None),
            ("lm_head.weight", (n_vocab, hidden), 0.3 * wide, head)]


def _tensors(plan: list[Tensor]) -> Iterator[tuple[str, np.ndarray]]:
    """The planned tensors one at a time, drawn in order from one seeded generator (the same bytes every run)."""
    rng = np.random.default_rng(SEED)
    for name, dims, std, edit in plan:
        arr = np.ones(dims, np.float32) if std is None else (rng.standard_normal(dims) * std).astype(np.float32)
        if edit is not None:
            edit(arr)
        yield name, arr


def _weights(n_vocab: int, allowed: np.ndarray, shape: LlamaShape = TINY) -> dict[str, np.ndarray]:
    """The model's tensors by their Hugging Face names (F32), all in memory (``_plan``)."""
    return dict(_tensors(_plan(n_vocab, allowed, shape)))


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Q/K rows from Hugging Face's rotate-half RoPE layout to llama.cpp's interleaved one (as llama.cpp's
    convert_hf_to_gguf.py does), so both forms compute the same function."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


GGUF_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _gguf_name(hf_name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{GGUF_TENSORS[rest.removesuffix('.weight')]}.weight"


def _gguf_writer(path: Path, tok: Any, shape: LlamaShape) -> Any:
    """A ``gguf.GGUFWriter`` at ``path`` with the model's metadata and tokenizer, no tensors yet."""
    gguf, _, _ = _modules()
    tokens, merges = _vocab(tok)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("farm tiny-llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(BOS))
    w.add_eos_token_id(tokens.index(EOS))
    w.add_unk_token_id(tokens.index(UNK))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    return w


def _gguf_array(name: str, arr: np.ndarray, shape: LlamaShape) -> np.ndarray:
    """Tensor ``name``'s bytes as the GGUF keeps them (Q and K rows in llama.cpp's RoPE layout)."""
    if name.endswith("q_proj.weight"):
        arr = _permute(arr, shape.heads)
    elif name.endswith("k_proj.weight"):
        arr = _permute(arr, shape.kv_heads)
    return np.ascontiguousarray(arr)


def write_gguf(path: Path, tok: Any, weights: dict[str, np.ndarray], shape: LlamaShape = TINY) -> Path:
    """The GGUF form at ``path``."""
    w = _gguf_writer(path, tok, shape)
    for name, arr in weights.items():
        w.add_tensor(_gguf_name(name), _gguf_array(name, arr, shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_large_gguf(path: Path, shape: LlamaShape) -> Path:
    """Only the GGUF form, of any size, written one tensor at a time (memory: the largest tensor, not the model):
    the same tokenizer, guard and seeded weights as :func:`build_tiny_llama`'s. ``LARGE`` makes a 2.16 GB file
    (above 2 GiB) that llama.cpp loads and serves at a few tokens per second on 2 cores."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    n_vocab = tok.get_vocab_size()
    plan = _plan(n_vocab, ordinary(tok, n_vocab), shape)
    w = _gguf_writer(path, tok, shape)
    for name, dims, _, _ in plan:
        w.add_tensor_info(_gguf_name(name), dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, arr in _tensors(plan):
        w.write_tensor_data(_gguf_array(name, arr, shape))
    w.close()
    return path


def _hf_config(n_vocab: int, bos: int, eos: int, shape: LlamaShape = TINY) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": n_vocab,
            "hidden_size": shape.hidden, "intermediate_size": shape.ffn, "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
            "max_position_embeddings": CONTEXT, "rms_norm_eps": RMS_EPS, "rope_theta": ROPE_THETA,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float32", "dtype": "float32",
            "use_cache": True}


def write_hf(folder: Path, tok: Any, weights: dict[str, np.ndarray], shape: LlamaShape = TINY) -> Path:
    """The Hugging Face form in ``folder`` (replaced if it exists)."""
    _, _, st = _modules()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    n_vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    config = _hf_config(n_vocab, bos, eos, shape)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}, indent=2, sort_keys=True) + "\n")
    st.save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
         "add_bos_token": False, "add_eos_token": False, "model_max_length": CONTEXT,
         "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}, indent=2, sort_keys=True) + "\n")
    for f in folder.iterdir():
        f.chmod(0o644)  # a container's unprivileged user reads the folder through a read-only mount
    return folder


def build_tiny_llama(out_dir: Path, shape: LlamaShape = TINY) -> TinyLlama:
    """Write both forms of the tiny Llama (or one of another ``shape``, same tokenizer) into ``out_dir``
    (created): ``tiny-llama.gguf`` and ``tiny-llama-hf/``; returns their paths."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RequestError(f"{out_dir} is a file; the tiny-llama example writes a folder (give a directory)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    n_vocab = tok.get_vocab_size()
    weights = _weights(n_vocab, ordinary(tok, n_vocab), shape)
    return TinyLlama(gguf=write_gguf(out_dir / GGUF_NAME, tok, weights, shape),
                     hf=write_hf(out_dir / HF_NAME, tok, weights, shape))

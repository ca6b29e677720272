"""LLM model inspection: a GGUF file (``gguf``: checked by its magic and header) or a Hugging Face model folder
(``hf``: ``config.json``, weights, tokenizer), hashed as farm stores it. A folder is stored file by file, named
by its ``farm.store.base.Manifest`` (:func:`folder_manifest`: each file's path, sha256 and size, hashed streaming),
so the same folder has the same sha256 on every host. Every failure is a one-line ``ModelError`` that says what
to do."""
from __future__ import annotations

import json
import struct
import tarfile
from pathlib import Path
from typing import BinaryIO

from farm.errors import ModelError
from farm.models.spec import ModelInfo, one_line, sha256_file
from farm.store.base import Manifest, ManifestEntry

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
WEIGHT_SUFFIXES = (".safetensors", ".bin")
#: weight files whose loading unpickles (runs code): served only in the jail or a container (SECURITY.md)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
#: config.json keys that give a Hugging Face model's context length, in order of preference
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "max_seq_len", "seq_length", "n_ctx")
#: GGUF value types: type id -> fixed size in bytes (8: string, 9: array are read by their lengths)
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_INTS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
MAX_GGUF_KEY = 1 << 16  # a metadata key longer than this is not GGUF
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
MAX_FOLDER_FILES = 10_000


def is_gguf(head: bytes) -> bool:
    return head.startswith(GGUF_MAGIC)


def inspect_gguf(path: Path) -> ModelInfo:
    """A GGUF file's facts: its magic, version and counts read from the header (no tensor is loaded)."""
    with open(path, "rb") as f:
        head = f.read(24)
    if not is_gguf(head):
        what = "empty" if not head else f"starts with {head[:4]!r}"
        raise ModelError(f"{path} is not a GGUF file (it {what}, not the GGUF magic); convert the model with "
                         "llama.cpp's convert_hf_to_gguf.py, or give a Hugging Face folder to the transformers engine")
    if len(head) < 24:
        raise ModelError(f"{path} is a truncated GGUF file ({len(head)} bytes); download or convert it again")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in GGUF_VERSIONS:
        raise ModelError(f"{path} is GGUF version {version}; farm's engines read versions "
                         f"{', '.join(map(str, GGUF_VERSIONS))}: convert it again with a current llama.cpp")
    if n_tensors == 0:
        raise ModelError(f"{path} is a GGUF file with no tensors (a vocabulary-only file?); give a model")
    size = path.stat().st_size
    return ModelInfo(format="gguf", sha256=sha256_file(path), size_bytes=size, inputs=[], outputs=[],
                     dynamic_batch=True, notes=[f"GGUF v{version}: {n_tensors} tensors, {n_kv} metadata keys"],
                     context_tokens=gguf_context_length(path))


class _Reader:
    """Bounded reads of a GGUF header: a short read (a truncated or lying file) raises EOFError."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise EOFError
        return data

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self, limit: int) -> bytes | None:
        """A GGUF string; None (skipped) when longer than ``limit``."""
        n = self.u64()
        if n > limit:
            self.f.seek(n, 1)
            self.take(0)
            return None
        return self.take(n)

    def value(self, kind: int) -> object:
        """A metadata value: an int or a short string; other values and arrays are skipped (None)."""
        if kind in _GGUF_INTS:
            return struct.unpack(_GGUF_INTS[kind], self.take(_GGUF_SIZES[kind]))[0]
        if kind in _GGUF_SIZES:
            self.take(_GGUF_SIZES[kind])
            return None
        if kind == 8:
            return self.string(4096)
        if kind == 9:
            item, n = self.u32(), self.u64()
            if item in _GGUF_SIZES:
                self.f.seek(n * _GGUF_SIZES[item], 1)
                return None
            for _ in range(n):  # strings or arrays: each element takes at least 8 bytes, so EOF ends a lie
                self.value(item)
            return None
        raise ValueError(f"unknown GGUF value type {kind}")


def gguf_context_length(path: Path) -> int | None:
    """The context length a GGUF file declares (``<arch>.context_length``), read from its metadata with bounded
    reads and no tensor loaded; None when it declares none or the header cannot be read."""
    try:
        with open(path, "rb") as f:
            r = _Reader(f)
            r.take(8)
            r.u64()
            n_kv, arch, found = r.u64(), None, {}
            for _ in range(n_kv):
                key = r.string(MAX_GGUF_KEY)
                val = r.value(r.u32())
                if key == b"general.architecture" and isinstance(val, bytes):
                    arch = val.decode(errors="replace")
                elif key is not None and key.endswith(b".context_length") and isinstance(val, int):
                    found[key.decode(errors="replace")] = val
                if arch is not None and f"{arch}.context_length" in found:
                    return found[f"{arch}.context_length"] or None
    except (OSError, EOFError, ValueError, struct.error, OverflowError):
        return None
    return next(iter(found.values()), None) or None


def hf_context_length(config: dict[str, object]) -> int | None:
    """The context length a Hugging Face ``config.json`` declares (``CONTEXT_KEYS``, or its ``text_config``'s)."""
    for source in (config, config.get("text_config")):
        if isinstance(source, dict):
            for key in CONTEXT_KEYS:
                value = source.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None


def pickle_weights(folder: Path) -> list[str]:
    """The files of a model folder whose loading unpickles (``PICKLE_SUFFIXES``: ``pytorch_model.bin``...)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.suffix.lower() in PICKLE_SUFFIXES and p.is_file())


def _folder_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink())
    if len(files) > MAX_FOLDER_FILES:
        raise ModelError(f"{path} holds {len(files)} files (more than {MAX_FOLDER_FILES}); "
                         "give the model folder itself")
    for p in files:
        if p.is_symlink() and not p.resolve().is_relative_to(path.resolve()):
            raise ModelError(f"{p} links outside the model folder; copy the file into the folder")
    return files


def check_hf_folder(path: Path) -> dict[str, object]:
    """The folder's ``config.json`` once the folder holds what ``from_pretrained`` needs offline."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{path} is a folder without config.json; give a Hugging Face model folder "
                         "(config.json, weights, tokenizer) or a model file")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{config_file} is not readable JSON ({one_line(exc, 120)}); "
                         "fix or re-save the model") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelError(f"{config_file} names no model_type; re-save the model with save_pretrained")
    if not any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir()):
        raise ModelError(f"{path} has no weights (*.safetensors or *.bin); re-save the model with save_pretrained")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(f"{path} has no tokenizer ({' or '.join(TOKENIZER_FILES)}); save the tokenizer beside the "
                         "model (tokenizer.save_pretrained)")
    return config


def folder_manifest(path: Path) -> Manifest:
    """The folder as farm stores it: each file (links resolved to their files) with its sha256, read in
    chunks (constant memory). Remembered for the folder's unchanged state (each file's size and mtime), so
    the submit that inspected it stores it without hashing it again."""
    files = _folder_files(path)
    state = tuple((p.relative_to(path).as_posix(), *_stamp(p)) for p in files)
    key = (str(path.resolve()), state)
    if key not in _MANIFESTS:
        entries = tuple(ManifestEntry(path=rel, sha256=sha256_file(p), size=size)
                        for (rel, size, _), p in zip(state, files, strict=True))
        _MANIFESTS.clear()  # one folder at a time: a submit inspects, then stores, one model
        _MANIFESTS[key] = Manifest(files=entries)
    return _MANIFESTS[key]


def _stamp(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_size, st.st_mtime_ns


#: the last folder hashed (:func:`folder_manifest`), by its path and files' (path, size, mtime)
_MANIFESTS: dict[tuple[str, tuple[tuple[str, int, int], ...]], Manifest] = {}


def inspect_hf_folder(path: Path) -> ModelInfo:
    """A Hugging Face folder's facts; its sha256 is that of its :func:`folder_manifest`."""
    config = check_hf_folder(path)
    manifest = folder_manifest(path)
    archs = config.get("architectures") or [config["model_type"]]
    arch = ", ".join(str(a) for a in archs) if isinstance(archs, list) else str(archs)
    pickled = pickle_weights(path)
    notes = [f"Hugging Face folder: {arch}"]
    if pickled:
        notes.append(f"pickle weights ({', '.join(pickled[:3])}): served only in the jail or a container; "
                     "re-save as safetensors (save_pretrained(safe_serialization=True)) to be served anywhere")
    return ModelInfo(format="hf", sha256=manifest.digest(), size_bytes=manifest.size, inputs=[],
                     outputs=[], dynamic_batch=True, notes=notes, context_tokens=hf_context_length(config))


def unpack_folder(tar_path: Path) -> Path:
    """The folder stored as ``tar_path`` (an artifact stored before the model store, issue 38, as one tar),
    unpacked beside it once (``<tar>.d``); returns it."""
    target = tar_path.with_name(tar_path.name + ".d")
    if target.is_dir():
        return target
    tmp = target.with_name(f".{target.name}.tmp")
    if tmp.exists():
        for p in sorted(tmp.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        tmp.rmdir()
    with tarfile.open(tar_path) as tar:
        tar.extractall(tmp, filter="data")  # data filter: no absolute paths, links out, devices or owners
    for p in [tmp, *tmp.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # containers read it as an unprivileged user
    tmp.rename(target)
    return target


def weights_bytes(path: Path) -> int:
    """The bytes of an LLM model's file or folder: a lower bound of the memory its server needs."""
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in _folder_files(path))


def check_fits(path: Path, limits: dict[str, int]) -> None:
    """ModelError when the model's weights alone exceed a memory limit (``limits``: name -> bytes), before
    any job runs: such a server is killed for memory while it loads."""
    size = weights_bytes(path)
    over = {name: limit for name, limit in limits.items() if size >= limit}
    if over:
        listed = ", ".join(f"{name} ({limit / 2**20:.0f} MiB)" for name, limit in over.items())
        raise ModelError(f"{path.name} holds {size / 2**20:.0f} MiB of weights, more than the memory limit of "
                         f"{listed}; give a smaller (quantized) model or a larger memory limit")

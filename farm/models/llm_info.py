"""LLM model inspection: a GGUF file (``gguf``: checked by its magic and header) or a Hugging Face model folder
(``hf``: ``config.json``, weights, tokenizer), hashed as farm stores it. A folder is stored as one
deterministic tar (:func:`folder_tar`: sorted members, no owner, no times, normalised modes), so the same
folder has the same sha256 on every host. Every failure is a one-line ``ModelError`` that says what to do."""
from __future__ import annotations

import hashlib
import io
import json
import struct
import tarfile
from pathlib import Path

from farm.errors import ModelError
from farm.models.spec import ModelInfo, one_line, sha256_file

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
WEIGHT_SUFFIXES = (".safetensors", ".bin")
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
                     dynamic_batch=True, notes=[f"GGUF v{version}: {n_tensors} tensors, {n_kv} metadata keys"])


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


def folder_tar(path: Path) -> bytes:
    """The folder as one deterministic, uncompressed tar: members sorted, owner 0, time 0, modes 644/755,
    links resolved to their files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in _folder_files(path):
            data = p.read_bytes()
            info = tarfile.TarInfo(p.relative_to(path).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def inspect_hf_folder(path: Path) -> ModelInfo:
    """A Hugging Face folder's facts; its sha256 is that of :func:`folder_tar`."""
    config = check_hf_folder(path)
    data = folder_tar(path)
    archs = config.get("architectures") or [config["model_type"]]
    arch = ", ".join(str(a) for a in archs) if isinstance(archs, list) else str(archs)
    return ModelInfo(format="hf", sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data), inputs=[],
                     outputs=[], dynamic_batch=True, notes=[f"Hugging Face folder: {arch}"])


def unpack_folder(tar_path: Path) -> Path:
    """The folder stored as ``tar_path`` (an artifact), unpacked beside it once (``<tar>.d``); returns it."""
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

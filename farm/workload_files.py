"""The files an LLM request brings beside its model (prompt, trace and tokenizer files), uploaded with it and
content-addressed like models, and the bounds its workload must keep before anything is allocated.

At submit (:func:`prepare`), each path the request names is hashed on the submitter's host in chunks (at most
``FARM_MAX_WORKLOAD_FILE_BYTES``; a folder by its ``farm.store.base.Manifest``) and replaced in the request by a
``schemas.llm.FileRef``; ``scheduler.enqueue`` streams the bytes into the model store through
``farm.artifacts.store_model``, the one function models are stored by. A worker reads such a file only from the
store (:func:`using`: ``farm.artifacts.using_model``, verified by its sha256 and pinned in the worker's cache while
the job reads it), never from a path of its own disk: in a cluster the path means nothing there, and a job must
not read a worker's files.

A tokenizer folder is uploaded as its ``tokenizer.json`` when it has one, else as a folder of the tokenizer's own
files only (``TOKENIZER_FILES``: a whole model folder is not uploaded twice).

:func:`check_prompt_bounds` checks the prompt lengths (a trace's line by line, ``farm.traces``) against the
model's context (read at submit from the GGUF file, the folder's ``config.json`` or the endpoint's ``/v1/models``)
and the host's cap (``FARM_MAX_PROMPT_TOKENS``),
at submit and again on the worker before its prompts are built.
"""
from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from farm import traces
from farm.artifacts import artifact_filename, store_model, using_model
from farm.errors import ArtifactError, RequestError
from farm.models.llm_info import folder_manifest, unpack_folder
from farm.models.spec import sha256_file
from farm.settings import get_settings
from schemas import ProfileRequest
from schemas.llm import WORKLOAD_FORMATS, FileRef, LlmSettings

#: the files of a tokenizer folder that are uploaded when it has no tokenizer.json (what AutoTokenizer reads)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json", "vocab.txt",
                   "merges.txt", "config.json")
OPTION = {"prompts": "--prompts", "trace": "--trace", "tokenizer": "--tokenizer"}


@dataclass(frozen=True)
class Upload:
    """A file to store with the request: where it is on the submitter's host, and its reference."""

    path: Path
    ref: FileRef


def _too_big(kind: str, label: str, size: int) -> RequestError:
    cap = get_settings().max_workload_file_bytes
    return RequestError(f"{OPTION[kind]} {label}: {size / 2**20:.1f} MiB, above the {cap / 2**20:.0f} MiB a request "
                        "may upload (FARM_MAX_WORKLOAD_FILE_BYTES)")


def _tokenizer_source(path: Path, label: str) -> Path:
    """What is uploaded of tokenizer ``path``: a file as it is, a folder's tokenizer.json, else a copy of its
    tokenizer files (``TOKENIZER_FILES``) under ``<home>/workload-files``."""
    if not path.is_dir() or (path / "tokenizer.json").is_file():
        return path / "tokenizer.json" if path.is_dir() else path
    files = [path / n for n in TOKENIZER_FILES if (path / n).is_file()]
    if not files:
        raise RequestError(f"--tokenizer {label}: the folder holds none of a tokenizer's files "
                           f"({', '.join(TOKENIZER_FILES[:5])}, ...); give a tokenizer.json or its folder")
    size = sum(f.stat().st_size for f in files)
    if size > get_settings().max_workload_file_bytes:
        raise _too_big("tokenizer", label, size)
    digest = hashlib.sha256(b"".join(f.name.encode() + b"\0" + sha256_file(f).encode() for f in files)).hexdigest()[:16]
    copy = get_settings().home / "workload-files" / f"{digest}-tokenizer"
    if not copy.is_dir():
        tmp = copy.with_name(f".{copy.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, tmp / f.name)
        tmp.rename(copy)
    return copy


def upload(kind: str, path_text: str) -> Upload:
    """The file ``path_text`` of the submitter's (``kind``: prompts, trace or tokenizer), hashed in chunks once;
    RequestError (one line) when it is missing or larger than ``FARM_MAX_WORKLOAD_FILE_BYTES``."""
    path = Path(path_text).expanduser()
    if not path.exists():
        raise RequestError(f"{OPTION[kind]} {path_text}: no such file or folder")
    source = _tokenizer_source(path, path_text) if kind == "tokenizer" else path
    if not source.is_file() and not source.is_dir():
        raise RequestError(f"{OPTION[kind]} {path_text}: not a file")
    size = source.stat().st_size if source.is_file() else sum(p.stat().st_size for p in source.rglob("*")
                                                               if p.is_file())
    if size > get_settings().max_workload_file_bytes:
        raise _too_big(kind, path_text, size)
    try:  # hashed in chunks: a file as one blob, a folder as its manifest (farm.store)
        sha = folder_manifest(source).digest() if source.is_dir() else sha256_file(source)
    except OSError as exc:
        raise RequestError(f"{OPTION[kind]} {path_text}: cannot read it ({exc.strerror})") from None
    ref = FileRef(kind=kind, sha256=sha, filename=artifact_filename(source), size_bytes=size,  # type: ignore[arg-type]
                  label=path_text)
    return Upload(source, ref)


def prepare(request: ProfileRequest) -> tuple[ProfileRequest, list[Upload]]:
    """``request`` with each file its LLM workload names on this host replaced by its reference, and the files to
    store; the same request and nothing to store when it names none (or names stored ones already)."""
    llm = request.measurement.llm
    if llm is None:
        return request, []
    uploads = [upload(kind, v) for kind, v in llm.files().items() if isinstance(v, str)]
    if not uploads:
        return request, []
    refs: dict[str, FileRef] = {u.ref.kind: u.ref for u in uploads}
    new_llm = llm.model_copy(update=refs)
    measurement = request.measurement.model_copy(update={"llm": new_llm})
    return request.model_copy(update={"measurement": measurement}), uploads


def store(session: Session, uploads: Iterable[Upload]) -> None:
    """Put each upload in the artifact store (once per sha256) within ``session``'s transaction."""
    for u in uploads:
        store_model(session, u.path, u.ref.sha256, WORKLOAD_FORMATS[u.ref.kind], [])


@contextmanager
def using(ref: FileRef) -> Iterator[Path]:
    """The worker's verified copy of a stored upload (a folder unpacked), pinned in its cache for the block (no
    eviction removes it while the job reads it); ArtifactError when it is missing, not what the job names, or
    larger than this worker's ``FARM_MAX_WORKLOAD_FILE_BYTES``."""
    cap = get_settings().max_workload_file_bytes
    if ref.size_bytes > cap:
        raise ArtifactError(f"the job's {ref.kind} file is {ref.size_bytes / 2**20:.1f} MiB, above this worker's "
                            f"{cap / 2**20:.0f} MiB (FARM_MAX_WORKLOAD_FILE_BYTES)")
    with using_model(ref.sha256, ref.filename) as path:
        yield _checked(ref, path)


def _checked(ref: FileRef, path: Path) -> Path:
    """``path`` (the cache's copy of ``ref``) when its size is the one the job names; ArtifactError otherwise."""
    if path.is_file() and ref.filename.endswith(".tar"):  # a folder stored as one tar (before issue 38)
        return unpack_folder(path) if path.stat().st_size == ref.size_bytes else _wrong_size(ref)
    size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path if size == ref.size_bytes else _wrong_size(ref)


def _wrong_size(ref: FileRef) -> Path:
    raise ArtifactError(f"the job's {ref.kind} file {ref.sha256[:12]} is not the size the job names; resubmit")


@contextmanager
def local_files(llm: LlmSettings, submitting: bool) -> Iterator[dict[str, Path]]:
    """The workload's files by field as this process reads them, for the block: stored ones fetched and pinned
    (:func:`using`), and where ``submitting`` (the submitter's own host, before upload) paths as given.
    RequestError for a path on a worker: a job reads only what was uploaded with its request."""
    with ExitStack() as pins:
        yield _local_files(llm, submitting, pins)


def _local_files(llm: LlmSettings, submitting: bool, pins: ExitStack) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for kind, value in llm.files().items():
        if isinstance(value, FileRef):
            out[kind] = pins.enter_context(using(value))
        elif submitting:
            out[kind] = Path(value).expanduser()
            if not out[kind].exists():
                raise RequestError(f"{OPTION[kind]} {value}: no such file or folder")
        else:
            raise RequestError(f"the job names {OPTION[kind]} {value} as a path on the worker's disk, which a job "
                               "never reads: submit the request again (its files are uploaded with it)")
    return out


def _context_of(context: int | None, knobs: Iterable[Mapping[str, object]]) -> int | None:
    """The smallest context a job's server has: the model's, or a job's ``n_ctx`` knob where it says less."""
    ctxs = [v for k in knobs for v in [k.get("n_ctx")] if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    found = [c for c in (context, *ctxs) if c]
    return min(found) if found else None


def check_prompt_bounds(llm: LlmSettings, context: int | None = None,
                        knobs: Iterable[Mapping[str, object]] = ()) -> None:
    """RequestError (one line) when the workload's prompts may hold more tokens than this host's cap
    (``FARM_MAX_PROMPT_TOKENS``), or a prompt with its output more than the model's ``context`` (None: unknown)."""
    cap = get_settings().max_prompt_tokens
    if llm.trace is not None:  # its own lengths, line by line (a stored one: checked by the worker as it builds)
        if isinstance(llm.trace, str):
            trace = traces.read(Path(llm.trace).expanduser(), llm.trace, llm.trace_tokens, llm.trace_limit,
                                get_settings().max_workload_file_bytes)
            traces.check(trace, llm.trace, _context_of(context, knobs), cap, llm.trace_tokens)
        return
    prompt = llm.prompt_tokens_max()
    parts = f"prefix {llm.prefix_tokens} + input up to {llm.input_tokens.upper()}" if not isinstance(
        llm.sessions, int) else f"a session's last turn: {llm.sessions} inputs and {llm.sessions - 1} answers"
    if llm.prompts is None and prompt > cap:
        raise RequestError(f"prompts of up to {prompt} tokens ({parts}) are above the {cap} tokens a prompt may hold "
                           "here (FARM_MAX_PROMPT_TOKENS); shorten --input-tokens/--prefix-tokens")
    ctx = _context_of(context, knobs)
    total = (0 if llm.prompts is not None else prompt) + llm.output_tokens.upper()
    if ctx is not None and total > ctx:
        what = f"{parts} + output up to {llm.output_tokens.upper()}" if llm.prompts is None else \
            f"output up to {llm.output_tokens.upper()}"
        raise RequestError(f"requests of up to {total} tokens ({what}) do not fit the model's context of {ctx} "
                           "tokens; shorten the prompt or the output")

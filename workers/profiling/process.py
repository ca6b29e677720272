"""Running one op-profiling pass as a process and reading what it reported. Imported by the edge bench inside
farm's runtime image too, so it needs nothing of farm's database side (no ``farm.settings``).

The pass loads an untrusted model, whose code (TorchScript) runs in the pass's process and may print anything, so
its stdout is never read for the result: the pass writes its report to a channel of its own, a pipe inherited as
``--result-fd`` (a local process, jailed or not) or a file of a random name in its output directory
(``--result-file``: a container's). The report is read up to ``MAX_REPORT_BYTES``; the trace file it names must be
a regular file inside the pass's output directory (no link out, no ``..``), read up to ``MAX_RAW_TRACE`` bytes and
kept while its compressed size stays within ``MAX_TRACE_BYTES``: a model cannot make the worker read a host file.
"""
from __future__ import annotations

import base64
import gzip
import io
import json
import os
import secrets
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.op_profile import MAX_EVENTS, MAX_TRACE_BYTES, PROFILE_ITERATIONS, PROFILE_WARMUP, OpProfile, missing

#: the key of the pass's result line on stdout (``python -m workers.profiling``)
MARKER = "op_profile"

#: the longest a pass may take (load twice, warm up, profile), s; bounded further by the job's own time limit
PASS_TIMEOUT_S = 300.0
#: the largest report a pass may write (its profile's nodes), bytes
MAX_REPORT_BYTES = 64 << 20
#: the largest raw trace file read back (its compressed copy is bounded by ``MAX_TRACE_BYTES``), bytes
MAX_RAW_TRACE = 512 << 20
STDERR_TAIL = 4096  # the bytes of a pass's stderr kept for its error message


@dataclass(frozen=True)
class PassOptions:
    """How long a pass profiles and how much it reads (``FARM_OP_PROFILE_*`` on the worker's side);
    ``abort``: the test harness's crash (``FARM_OP_PROFILE_CRASH``)."""

    iterations: int = PROFILE_ITERATIONS
    max_events: int = MAX_EVENTS
    abort: bool = False

    def argv(self) -> list[str]:
        return ["--warmup", str(PROFILE_WARMUP), "--iterations", str(self.iterations), "--max-events",
                str(self.max_events), *(("--abort",) if self.abort else ())]


def pass_argv(model_path: Path, engine: str, batch_size: int, threads: int, device: str, inputs: str, out: Path,
              data: Path | None, opts: PassOptions, compute_ms: float | None = None) -> list[str]:
    """The pass's command line (``inputs``: the job's ``--inputs`` JSON, ``runners.common.job_inputs``)."""
    return [sys.executable, "-m", "workers.profiling", "--model", str(model_path), "--engine", engine,
            "--batch-size", str(batch_size), "--threads", str(threads), "--device", device, "--inputs", inputs,
            *opts.argv(), "--out", str(out), *(("--input-data", str(data)) if data is not None else ()),
            *(("--compute-ms", f"{compute_ms:.6f}") if compute_ms is not None else ())]


def out_dir(argv: list[str]) -> Path:
    """The pass's output directory, its ``--out`` (``pass_argv`` puts it there)."""
    return Path(argv[argv.index("--out") + 1])


def pass_process(engine: str, argv: list[str], timeout: float, cpus: set[int] | None = None,
                 env: dict[str, str] | None = None) -> tuple[OpProfile, bytes | None]:
    """Run the pass ``argv`` (``pass_argv``, maybe jailed) as a process (on ``cpus``; None: this process's own),
    within ``timeout`` s, with the environment ``env`` (None: this process's, as inside an edge container, whose
    environment is clean); its report comes back through a pipe of its own (``--result-fd``), its stdout is
    discarded."""
    read_end, write_end = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_bounded, args=(read_end, chunks), daemon=True)
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen([*argv, "--result-fd", str(write_end)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err, pass_fds=(write_end,), env=env,
                                    start_new_session=True,
                                    preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        finally:
            os.close(write_end)
        reader.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return missing(engine, "failed", f"the profiling pass took over {timeout:g} s and was stopped"), None
        finally:
            reader.join(5.0)
        err.seek(max(0, err.seek(0, io.SEEK_END) - STDERR_TAIL))
        stderr = err.read().decode("utf-8", errors="replace")
    return read_pass(engine, code, b"".join(chunks), stderr, out_dir(argv))


def _read_bounded(fd: int, chunks: list[bytes]) -> None:
    """Read the pipe ``fd`` to its end, keeping at most ``MAX_REPORT_BYTES`` + 1 bytes (more: not a report)."""
    kept = 0
    with os.fdopen(fd, "rb", buffering=0) as f:
        while data := f.read(1 << 16):
            if kept <= MAX_REPORT_BYTES:
                chunks.append(data[:MAX_REPORT_BYTES + 1 - kept])
                kept += len(chunks[-1])


def result_file_name() -> str:
    """A name a container's pass writes its report under in its output directory (unguessable by its model)."""
    return f"result-{secrets.token_hex(16)}.json"


def read_report(out: Path, name: str) -> bytes:
    """The report a container's pass wrote to ``out/name`` (a regular file, not a link), up to
    ``MAX_REPORT_BYTES`` + 1 bytes; empty when there is none."""
    try:
        fd = os.open(out / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return b""
        return f.read(MAX_REPORT_BYTES + 1)


def read_pass(engine: str, code: int, report: bytes, stderr: str, out: Path,
              inside: str | None = None) -> tuple[OpProfile, bytes | None]:
    """The profile a pass reported (and its trace file, compressed), or a ``failed`` one saying why. ``out``: the
    pass's output directory here; ``inside``: the same directory as the pass saw it (a container's)."""
    got = _report(report)
    if got is None or "profile" not in got:
        why = (got or {}).get("error") or _crash(code, stderr)
        return missing(engine, "failed", f"the profiling pass failed: {str(why)[:400]}"), None
    try:
        prof = OpProfile.model_validate(got["profile"])
    except ValueError as exc:
        return missing(engine, "failed", f"the profiling pass reported no valid profile: {str(exc)[:300]}"), None
    trace = got.get("trace")
    if not trace:
        return prof, None
    try:
        packed = _trace_gz(out, str(trace), inside)
    except (OSError, ValueError) as exc:
        note = f"raw trace not kept: {exc}"
        return prof.model_copy(update={"reason": "; ".join(x for x in (prof.reason, note) if x),
                                       "trace_format": None}), None
    return prof, packed


def _report(data: bytes) -> dict[str, Any] | None:
    if len(data) > MAX_REPORT_BYTES:
        return {"error": f"its report is larger than {MAX_REPORT_BYTES >> 20} MiB"}
    try:
        got = json.loads(data)
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


def _trace_gz(out: Path, trace: str, inside: str | None) -> bytes:
    """The trace file ``trace`` (as the pass named it) gzip-compressed, once it is known to be a regular file of its
    own directly inside ``out``; ValueError saying why it is not kept otherwise."""
    name = trace
    if inside is not None:
        if not trace.startswith(inside.rstrip("/") + "/"):
            raise ValueError("it is not in the pass's output directory")
        name = trace[len(inside.rstrip("/")) + 1:]
    elif Path(trace).parent.resolve() == out.resolve():
        name = Path(trace).name
    if not name or "/" in name or name in (".", ".."):
        raise ValueError("it is not in the pass's output directory")
    fd = os.open(out / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise ValueError("it is not a regular file of its own")
        if st.st_size > MAX_RAW_TRACE:
            raise ValueError(f"{st.st_size / 2**20:.0f} MiB, above {MAX_RAW_TRACE >> 20} MiB")
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz:
            left = MAX_RAW_TRACE
            while left > 0 and (data := f.read(min(1 << 20, left))):
                gz.write(data)
                left -= len(data)
                if buf.tell() > MAX_TRACE_BYTES:
                    raise ValueError(f"over {MAX_TRACE_BYTES / 2**20:.0f} MiB compressed")
    packed = buf.getvalue()
    if len(packed) > MAX_TRACE_BYTES:
        raise ValueError(f"{len(packed) / 2**20:.0f} MiB compressed, above {MAX_TRACE_BYTES / 2**20:.0f} MiB")
    return packed


def _crash(code: int, stderr: str) -> str:
    last = (stderr.strip().splitlines() or [""])[-1][:200]
    how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    return f"{how}{': ' + last if last else ''}"


EDGE_MARKER = "edge_op_profile"
#: the largest compressed trace an edge run prints on its stdout (base64); a larger one is not kept
EDGE_TRACE_BYTES = 4 * 1024 * 1024


def edge_profile_line(prof: OpProfile, trace_gz: bytes | None) -> dict[str, Any]:
    """An edge run's profile as the JSON line its bench prints (the trace while small enough)."""
    line: dict[str, Any] = {EDGE_MARKER: 1, "profile": prof.model_dump()}
    if trace_gz is not None and len(trace_gz) <= EDGE_TRACE_BYTES:
        line["trace_gz_b64"] = base64.b64encode(trace_gz).decode()
    elif trace_gz is not None:
        note = f"raw trace not kept: over {EDGE_TRACE_BYTES / 2**20:.0f} MiB compressed from an edge run"
        line["profile"]["reason"] = "; ".join(x for x in (prof.reason, note) if x)
        line["profile"]["trace_format"] = None
    return line


def edge_profile(stdout: str, engine: str) -> tuple[OpProfile, bytes | None]:
    """The profile an edge run printed, or a ``failed`` one when it printed none (the run ended first). Its trace
    is data printed inside the box (never a path), kept only up to ``EDGE_TRACE_BYTES``."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{") and f'"{EDGE_MARKER}"' in line:
            try:
                got = json.loads(line)
                packed = got.get("trace_gz_b64")
                if isinstance(packed, str) and len(packed) > (EDGE_TRACE_BYTES * 4) // 3 + 4:
                    packed = None
                return OpProfile.model_validate(got["profile"]), base64.b64decode(packed) if packed else None
            except (ValueError, KeyError, TypeError):
                break
    return missing(engine, "failed", "the edge run ended before its profiling pass printed a profile"), None

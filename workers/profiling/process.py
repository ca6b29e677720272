"""Running one op-profiling pass as a process and reading what it printed. Imported by the edge bench inside
farm's runtime image too, so it needs nothing of farm's database side (no ``farm.settings``)."""
from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.op_profile import MAX_EVENTS, MAX_TRACE_BYTES, PROFILE_ITERATIONS, PROFILE_WARMUP, OpProfile, missing
from workers.profiling.__main__ import MARKER

#: the longest a pass may take (load twice, warm up, profile), s; bounded further by the job's own time limit
PASS_TIMEOUT_S = 300.0


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


def pass_process(engine: str, argv: list[str], timeout: float, cpus: set[int] | None = None,
                 env: dict[str, str] | None = None) -> tuple[OpProfile, bytes | None]:
    """Run the pass ``argv`` as a process (on ``cpus``; None: this process's own), within ``timeout`` s, with
    the environment ``env`` (None: this process's, as inside an edge container, whose environment is clean)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, start_new_session=True,
                              stdin=subprocess.DEVNULL, env=env,
                              preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    except subprocess.TimeoutExpired:
        return missing(engine, "failed", f"the profiling pass took over {timeout:g} s and was stopped"), None
    return read_pass(engine, proc.returncode, proc.stdout, proc.stderr)


def read_pass(engine: str, code: int, stdout: str, stderr: str,
              moved: tuple[str, Path] | None = None) -> tuple[OpProfile, bytes | None]:
    """The profile a pass printed (and its trace file, compressed), or a ``failed`` one saying why. ``moved``:
    (the pass's output directory as it saw it, the same directory here): a container's pass."""
    report = _last_report(stdout)
    if report is None or "profile" not in report:
        why = (report or {}).get("error") or _crash(code, stderr)
        return missing(engine, "failed", f"the profiling pass failed: {why}"[:500]), None
    prof = OpProfile.model_validate(report["profile"])
    trace = report.get("trace")
    if trace and moved is not None and trace.startswith(moved[0] + "/"):
        trace = str(moved[1] / trace[len(moved[0]) + 1:])
    if not trace or not Path(trace).is_file():
        return prof, None
    packed = gzip.compress(Path(trace).read_bytes(), compresslevel=6)
    if len(packed) > MAX_TRACE_BYTES:
        note = f"raw trace not kept: {len(packed) / 2**20:.0f} MiB compressed, above {MAX_TRACE_BYTES / 2**20:.0f} MiB"
        return prof.model_copy(update={"reason": "; ".join(x for x in (prof.reason, note) if x),
                                       "trace_format": None}), None
    return prof, packed


def _crash(code: int, stderr: str) -> str:
    last = (stderr.strip().splitlines() or [""])[-1][:200]
    how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    return f"{how}{': ' + last if last else ''}"


def _last_report(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and f'"{MARKER}"' in line:
            try:
                return dict(json.loads(line))
            except ValueError:
                continue
    return None


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
    """The profile an edge run printed, or a ``failed`` one when it printed none (the run ended first)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{") and f'"{EDGE_MARKER}"' in line:
            try:
                got = json.loads(line)
                packed = got.get("trace_gz_b64")
                return OpProfile.model_validate(got["profile"]), base64.b64decode(packed) if packed else None
            except (ValueError, KeyError):
                break
    return missing(engine, "failed", "the edge run ended before its profiling pass printed a profile"), None

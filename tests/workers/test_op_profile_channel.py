"""The op-profile pass reports through a channel of its own (issue 39 point 4): its stdout (the model's as much as
its own) is never read for the result; the trace file it names must be a regular file of its own output
directory, read up to a bound. A stand-in pass (a small script) plays the model that prints or names what it
likes."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from schemas.op_profile import missing
from workers.profiling import process

SCRIPT = r"""
import json, os, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
plan = json.loads(os.environ["PLAN"])
for name, text in plan.get("files", {}).items():
    with open(os.path.join(out, name), "w") as f:
        f.write(text)
for name, target in plan.get("links", {}).items():
    os.symlink(target, os.path.join(out, name))
print(json.dumps(plan["stdout"]), flush=True)  # what a model's print() can do
if "--result-fd" in args and plan.get("report") is not None:
    report = dict(plan["report"])
    if report.get("trace") and not report["trace"].startswith("/"):
        report["trace"] = os.path.join(out, report["trace"])
    with os.fdopen(int(args[args.index("--result-fd") + 1]), "w") as f:
        f.write(json.dumps(report))
"""
PROFILE = missing("onnxruntime", "none", "stand-in pass").model_dump()


def _run(tmp_path: Path, plan: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> tuple[object, bytes | None]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    monkeypatch.setenv("PLAN", json.dumps(plan))
    return process.pass_process("onnxruntime", [sys.executable, "-c", SCRIPT, "--out", str(out)], 60)


@pytest.fixture
def host_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("FARM_DATABASE_URL=postgresql://farm:hunter2@db/farm\n")
    return secret


def test_a_printed_marker_is_not_the_report(tmp_path: Path, host_secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: the pass's result was the last marker line of its stdout, so a model that printed a fake one named
    any host file (``/proc/self/environ``) as its trace and the worker stored it. Now the printed line is ignored."""
    fake = {process.MARKER: 1, "profile": PROFILE, "trace": str(host_secret)}
    prof, trace = _run(tmp_path, {"stdout": fake, "report": {process.MARKER: 1, "profile": PROFILE, "trace": None}},
                       monkeypatch)
    assert trace is None and prof.reason == "stand-in pass"  # type: ignore[attr-defined]
    prof, trace = _run(tmp_path, {"stdout": fake, "report": None}, monkeypatch)
    assert trace is None and prof.status == "failed"  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["outside", "link", "dotdot"])
def test_the_trace_stays_in_the_output_directory(tmp_path: Path, host_secret: Path, monkeypatch: pytest.MonkeyPatch,
                                                 how: str) -> None:
    trace = {"outside": str(host_secret), "link": "t.json", "dotdot": "../host-secret.txt"}[how]
    plan = {"stdout": "", "links": {"t.json": str(host_secret)} if how == "link" else {},
            "report": {process.MARKER: 1, "profile": PROFILE, "trace": trace}}
    prof, packed = _run(tmp_path, plan, monkeypatch)
    assert packed is None and "raw trace not kept" in (prof.reason or ""), prof  # type: ignore[attr-defined]


def test_a_trace_in_bounds_is_kept_and_one_past_them_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = json.dumps({"traceEvents": [{"name": "n", "ph": "X", "ts": i, "dur": 1} for i in range(50)]})
    plan = {"stdout": "", "files": {"t.json": events},
            "report": {process.MARKER: 1, "profile": PROFILE, "trace": "t.json"}}
    _, packed = _run(tmp_path, plan, monkeypatch)
    assert packed is not None and gzip.decompress(packed).decode() == events
    monkeypatch.setattr(process, "MAX_RAW_TRACE", 100)
    (tmp_path / "b").mkdir()
    prof, packed = _run(tmp_path / "b", plan, monkeypatch)
    assert packed is None and "above" in (prof.reason or "")  # type: ignore[attr-defined]


def test_an_oversized_report_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "MAX_REPORT_BYTES", 64)
    prof, packed = _run(tmp_path, {"stdout": "", "report": {process.MARKER: 1, "profile": PROFILE}}, monkeypatch)
    assert packed is None and prof.status == "failed" and "larger than" in (prof.reason or "")  # type: ignore[attr-defined]


def test_a_containers_report_file_is_read_only_as_a_regular_file(tmp_path: Path, host_secret: Path) -> None:
    name = process.result_file_name()
    (tmp_path / name).symlink_to(host_secret)
    assert process.read_report(tmp_path, name) == b""
    (tmp_path / name).unlink()
    (tmp_path / name).write_text('{"op_profile": 1}')
    assert process.read_report(tmp_path, name) == b'{"op_profile": 1}'
    report = json.dumps({process.MARKER: 1, "profile": PROFILE, "trace": "/out/../host-secret.txt"}).encode()
    prof, packed = process.read_pass("onnxruntime", 0, report, "", tmp_path, inside="/out")
    assert packed is None and "not kept" in (prof.reason or "")

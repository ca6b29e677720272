"""A fuzz pass over the request schema and the CLI (issue 27 point 8): generated requests and generated command
lines never crash farm. A request either validates or raises pydantic's ValidationError; ``farm submit``,
``farm results`` and ``farm compare`` (through Typer's CliRunner) exit 0, 1, 2 or 3 with one line, never 70
(farm's "internal error") nor with an exception. Each test counts the inputs it tried and prints the count
(``pytest -s``)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from farm.cli.main import main
from farm.readers.results import recent_requests
from schemas import ProfileRequest

TRIED: dict[str, int] = {}
FIELDS = ["model", "format", "engines", "devices", "batch_sizes", "concurrency", "rates", "inputs", "edge", "name",
          "measurement", "input_data", "endpoint", "model_name", "repeats", "search", "p99_ms", "mode", "client",
          "duration_s", "threads", "bogus"]
TEXT = st.text(alphabet=st.sampled_from(list("0123456789abcxyzFPINT:x,.-_ []/\\{}@\x1b\x00\u202e")), max_size=24)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), TEXT)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.sampled_from(FIELDS + ["cpus", "memory",
                                                                      "command", "image", "dtype", "shape"]),
                                                                      inner, max_size=4)), max_leaves=12)
INPUT = st.builds(lambda n, d, s: f"{n}:{d}:{s}", st.sampled_from(["x", "input", "", "a b"]),
                  st.sampled_from(["FP32", "INT64", "BOOL", "FP16", "BYTES", "fp32", "X"]),
                  st.sampled_from(["256", "3x224x224", "1000000000", "0", "-1", "65536x65536", "4x", "1e9"]))


def _count(what: str) -> None:
    TRIED[what] = TRIED.get(what, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print("\nfuzz inputs tried: " + ", ".join(f"{k} {v}" for k, v in sorted(TRIED.items())))


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"model": st.sampled_from(["m.onnx", "", "x.pt"])},
                             optional={k: VALUE for k in FIELDS[1:]})
       | st.fixed_dictionaries({"model": st.just("m.onnx"), "batch_sizes": st.lists(st.integers(-5, 70000), max_size=6),
                                "concurrency": st.lists(st.integers(-5, 5000), max_size=6),
                                "inputs": st.lists(INPUT, max_size=3)}))
def test_request_schema_validates_or_says_why(data: dict[str, Any]) -> None:
    _count("request dicts")
    try:
        req = ProfileRequest.model_validate(data)
    except ValidationError as exc:
        assert exc.errors()  # a reason per field
        return
    assert req.model_dump(mode="json")  # a valid request serialises


OPTIONS = {
    "--batch-sizes": st.sampled_from(["1", "1,8", "0", "-1", "1..1000", "65536", "a", "1,,2", "1-4", ""]),
    "--concurrency": st.sampled_from(["1", "1,4", "0", "4096", "1..1000", "x", "[b]"]),
    "--input": INPUT, "--engine": st.sampled_from(["onnxruntime", "torchscript", "triton", "nope", ""]),
    "--device": st.sampled_from(["cpu", "gpu", "gpu:a100", "tpu", ""]),
    "--edge": st.sampled_from(["cpus=1,memory=512m", "cpus=0,memory=1", "cpus=1,memory=1x", "::", "box:1:512m",
                               "name=[b],cpus=0.5,memory=256m,cpuset=0-1", "cpus=1,memory=512m,cpuset=9-9",
                               "cpus=1e9,memory=-1", "cpus=1,memory=512m,bogus=1"]),
    "--rate": st.sampled_from(["10", "0", "-1", "1e400", "nan", "5,10", "x"]),
    "--duration": st.sampled_from(["1", "0", "-1", "nan", "inf", "1e308"]),
    "--windows": st.sampled_from(["3", "0", "-2", "x"]), "--threads": st.sampled_from(["0", "-1", "1000000"]),
    "--repeats": st.sampled_from(["1", "0", "21", "x"]), "--search": st.sampled_from(["quick", "none", "x"]),
    "--p99": st.sampled_from(["5", "0", "-1", "nan"]), "--mode": st.sampled_from(["closed", "poisson", "x"]),
    "--client": st.sampled_from(["auto", "farm", "perf_analyzer", "x"]), "--format": st.sampled_from(["onnx", "x"]),
    "--name": TEXT, "--timeout": st.sampled_from(["1", "0", "-5"]), "--input-data": st.sampled_from(["zeros",
                                                                                                   "/nonexistent.npz"]),
}


def _run(args: list[str]) -> tuple[int, str]:
    """``farm ARGS`` through the CLI's entry point inside CliRunner's isolation: (exit code, stderr)."""
    runner = CliRunner()
    with runner.isolation() as streams:
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        err = streams[1].getvalue().decode(errors="replace") if streams[1] is not None else ""
    return code, err


@pytest.fixture
def fuzz_db(sqlite_url: str, example_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database with one finished request (no-op jobs: nothing is served); its id."""
    from farm.settings import reset_settings

    monkeypatch.setenv("FARM_NOOP_JOBS", "1")
    monkeypatch.setenv("FARM_JOB_LIMIT", "64")  # a generated matrix stays small
    reset_settings()
    code, err = _run(["submit", str(example_onnx), "--batch-sizes", "1", "--concurrency", "1", "--json"])
    assert code == 0, err
    return str(recent_requests(limit=1)[0]["request_id"])


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(opts=st.lists(st.sampled_from(sorted(OPTIONS)).flatmap(lambda o: st.tuples(st.just(o), OPTIONS[o])),
                     max_size=5), model=st.sampled_from(["example", "missing", "dir"]))
def test_submit_with_generated_options_never_crashes(fuzz_db: str, example_onnx: Path, tmp_path: Path,
                                                      opts: list[tuple[str, str]], model: str) -> None:
    _count("farm submit command lines")
    path = {"example": str(example_onnx), "missing": str(tmp_path / "nope.onnx"), "dir": str(tmp_path)}[model]
    args = ["submit", path, *[a for pair in opts for a in pair], "--json"]
    code, err = _run(args)
    assert code != 70 and code in (0, 1, 2, 3), f"{args}: exit {code}: {err}"
    assert "Traceback" not in err, args


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cmd=st.sampled_from(["results", "compare"]), ids=st.lists(st.sampled_from(["REAL", "PREFIX", "zz", "", "[/b]",
                                                                                 "%", "\x1b]8;;x"]), min_size=1,
                                                                 max_size=2),
       extra=st.lists(st.sampled_from(["--format", "json", "csv", "parquet", "table", "x", "--merge-repeats",
                                       "--alpha", "0.05", "2", "-1", "nan", "--min-effect", "--ignore", "p99",
                                       "--json", "--fail-on-regression"]), max_size=4))
def test_results_and_compare_with_generated_arguments_never_crash(fuzz_db: str, cmd: str, ids: list[str],
                                                                   extra: list[str]) -> None:
    _count(f"farm {cmd} command lines")
    names = [{"REAL": fuzz_db, "PREFIX": fuzz_db[:6]}.get(i, i) for i in ids]
    code, err = _run([cmd, *names, *extra])
    assert code != 70 and code in (0, 1, 2, 3), f"{cmd} {names} {extra}: exit {code}: {err}"
    assert "Traceback" not in err

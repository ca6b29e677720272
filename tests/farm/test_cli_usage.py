"""Command-line mistakes and Ctrl-C: one line on stderr, exit 2 (Click's usage convention) or 130, no traceback.

Every registered command and group is found by walking the Typer app, so a new command is covered as soon
as it is registered.
"""
from __future__ import annotations

import inspect
import signal
import time
import typing
from pathlib import Path
from typing import Any

import pytest
import typer.main

from farm.cli.main import app, main
from tests.helpers import farm, signal_when, start_submit

NUMBERS = (int, float, int | None, float | None)


def _walk(cmd: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    """(path, command) for ``cmd`` and everything under it, groups included."""
    found = [(path, cmd)]
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        found += _walk(sub, [*path, name])
    return found


ALL = _walk(typer.main.get_command(app), [])
LEAVES = [(path, cmd) for path, cmd in ALL if not getattr(cmd, "commands", None)]


def _name(path: list[str]) -> str:
    return " ".join(path) or "farm"


def _required_args(cmd: Any) -> list[str]:
    return [p.name for p in cmd.params if p.param_type_name == "argument" and p.required]


def _numeric_options(cmd: Any) -> list[str]:
    """The first flag of every option whose annotation is a number."""
    hints = typing.get_type_hints(inspect.unwrap(cmd.callback))
    return [p.opts[0] for p in cmd.params if p.param_type_name == "option" and hints.get(p.name) in NUMBERS]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``farm ARGS`` in this process: (exit code, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    code = exc.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


def _assert_usage_error(code: int, err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], err
    assert "Traceback" not in err and "internal error" not in err


def test_the_walk_finds_every_command() -> None:
    names = {_name(path) for path, _ in LEAVES}
    assert {"submit", "results", "status", "workers", "worker", "serve", "db upgrade", "example-model",
            "analyze", "report", "scheduler", "cancel"} <= names


@pytest.mark.parametrize("path", [p for p, _ in ALL], ids=_name)
def test_unknown_option_is_a_usage_error(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run([*path, "--no-such-option"], capsys)
    _assert_usage_error(code, err, "No such option: --no-such-option")


@pytest.mark.parametrize("path", [p for p, c in LEAVES if _required_args(c)], ids=_name)
def test_missing_argument_is_a_usage_error(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(path, capsys)
    _assert_usage_error(code, err, "Missing")


@pytest.mark.parametrize("path,option", [(p, o) for p, c in LEAVES for o in _numeric_options(c)],
                         ids=lambda v: _name(v) if isinstance(v, list) else v)
def test_bad_number_is_a_usage_error(path: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    cmd = dict((tuple(p), c) for p, c in LEAVES)[tuple(path)]
    code, err = _run([*path, *["x"] * len(_required_args(cmd)), option, "not-a-number"], capsys)
    _assert_usage_error(code, err, option)


@pytest.mark.parametrize("args,needle", [
    (["submti"], "Did you mean 'submit'?"),
    (["db", "upgrad"], "No such command"),
    (["submit", "m.onnx", "--bacth-sizes", "1"], "--batch-sizes"),
    (["report", "x", "--top", "0"], "--top"),
    (["db", "upgrade", "head", "extra"], "extra"),
])
def test_misspelt_command_or_value_is_a_usage_error(args: list[str], needle: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(args, capsys)
    _assert_usage_error(code, err, needle)


@pytest.mark.parametrize("args,needle", [
    (["results", "x", "--format", "xml"], "--format"),
    (["submit", "MODEL", "--mode", "burst"], "mode"),
    (["submit", "MODEL", "--rpc", "grpc"], "rpc"),
    (["submit", "MODEL", "--client", "locust"], "client"),
])
def test_bad_choice_exits_2_with_one_line(args: list[str], needle: str, example_onnx: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run([str(example_onnx) if a == "MODEL" else a for a in args], capsys)
    _assert_usage_error(code, err, needle)


@pytest.mark.parametrize("path", [p for p, c in ALL if getattr(c, "commands", None)], ids=_name)
def test_group_without_a_command_shows_its_help(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(path)
    out = capsys.readouterr()
    assert exc.value.code == 2 and "Usage" in out.out + out.err
    assert "error" not in out.err and "Traceback" not in out.err


def test_usage_error_through_the_real_entry_point() -> None:
    proc = farm("submit", "m.onnx", "--bacth-sizes", "1", check=False)
    _assert_usage_error(proc.returncode, proc.stderr, "--bacth-sizes")
    assert "farm submit --help" in proc.stderr


def test_ctrl_c_exits_130_with_one_line(example_onnx: Path, tmp_path: Path) -> None:
    """A real SIGINT to ``python -m farm submit`` while it measures (embedded: the job runs in-process)."""
    err_path = tmp_path / "stderr"
    proc = start_submit(example_onnx, err_path, "--duration", "60")

    def measuring() -> bool | None:
        if "embedded mode" not in err_path.read_text():
            return None
        time.sleep(1.5)  # into the job: server starting or load running
        return True

    code, _ = signal_when(proc, err_path, measuring, signal.SIGINT)
    err = err_path.read_text()
    assert code == 130, err
    assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGINT; `farm resume "), err
    assert "Traceback" not in err

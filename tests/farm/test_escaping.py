"""User strings reach a terminal literally (issue 27, point 5): request names, model and input file names,
stored errors, worker ids and hostnames go through ``farm.formatting.safe_text`` (Rich markup escaped,
control characters shown as escapes), so ``[/bold]`` cannot crash ``farm status`` (it exited 70) and ESC/OSC
sequences never reach the terminal."""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import update

from farm.formatting import printable, safe_text

#: names a hostile submitter might choose: markup that closes or opens tags, a hyperlink, raw ESC/CSI, an OSC
#: title change and hyperlink, C1 CSI, CR overwriting, a bidi override, a trailing backslash
HOSTILE = ["[/bold]", "[/]", "[link=https://evil.example]click[/link]", "[bold red]x", "\x1b[31mred\x1b[0m",
           "\x1b]0;owned\x07", "\x1b]8;;https://evil.example\x1b\\x\x1b]8;;\x1b\\", "\x9b2J", "ok\rFAKE",
           "abc\u202edcba", "trailing\\", "\\[/bold]", "tab\tkept"]


def _rendered(markup: str) -> str:
    out = io.StringIO()
    Console(file=out, width=400, force_terminal=False, color_system=None).print(markup, highlight=False)
    return out.getvalue().rstrip("\n")


@pytest.mark.parametrize("text", HOSTILE)
def test_safe_text_renders_the_string_literally(text: str) -> None:
    shown = _rendered(safe_text(text))
    assert shown == printable(text).expandtabs(8)
    assert not any(ord(ch) < 0x20 and ch != "\t" or 0x7F <= ord(ch) <= 0x9F for ch in shown), repr(shown)
    assert "\u202e" not in shown


def test_printable_escapes_control_characters_and_keeps_the_rest() -> None:
    assert printable("a\x1b[31mb") == "a\\x1b[31mb"
    assert printable("x\u202ey") == "x\\u202ey"
    assert printable("caf\u00e9 \U0001f600 [x]\tz") == "caf\u00e9 \U0001f600 [x]\tz"
    assert printable("line\nnext") == "line\\x0anext"


def _farm(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from farm.cli.main import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_status_results_and_workers_show_hostile_names_literally(
        sqlite_url: str, example_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A request named ``[/bold]`` with a model file whose name holds markup and an OSC sequence, a stored
    error with ESC and markup, a worker with such an id and hostname: every command exits 0 and prints them
    as text."""
    from farm.db.models import Job, Worker
    from farm.db.session import session_scope
    from scheduler.enqueue import submit
    from schemas import ProfileRequest

    model = tmp_path / "m[" / "bold][link=x]\x1b]0;t\x07.onnx"  # its path holds [/bold]
    model.parent.mkdir()
    shutil.copy(example_onnx, model)
    sub = submit(ProfileRequest(model=str(model), name="[/bold]\x1b[2J"), send=False)
    rid = sub.request_id
    with session_scope() as s:
        s.execute(update(Job).where(Job.request_id == rid).values(status="failed",
                                                                 error="boom [/red] \x1b]8;;http://e\x07 [/]"))
        s.add(Worker(id="w[/]\x1b[1m", hostname="h[/bold]\x9b", hardware={"cpu": {"model": "[/x]"}},
                     queues=["cpu"]))
    for args in (("status",), ("status", rid), ("results", rid), ("workers",)):
        code, out, err = _farm(capsys, *args)
        assert code == 0, (args, err)
        assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out, (args, out)
    _, out, _ = _farm(capsys, "status")
    assert "[/bold]\\x1b[2J" in out
    _, out, _ = _farm(capsys, "status", rid)
    assert "boom [/red] \\x1b]8;;http://e\\x07 [/]" in out  # the error line under the job table
    _, out, _ = _farm(capsys, "results", rid)
    assert "boom [/red]" in out
    _, out, _ = _farm(capsys, "workers")
    assert "w[/]\\x1b[1m" in out and "h[/bold]\\x9b" in out


def test_error_lines_escape_control_characters(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A one-line error quoting a user's path shows its ESC as an escape, not as a terminal command."""
    code, out, err = _farm(capsys, "submit", str(tmp_path / "x\x1b]0;owned\x07.onnx"))
    assert code != 0 and "\x1b" not in err and "\\x1b]0;owned\\x07" in err, err


def test_html_report_escapes_every_user_string(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A model path, request name and stored error holding HTML and markup appear as text in the HTML report
    (the page's only script is its own check) and literally in ``farm report`` / ``farm results``."""
    import numpy as np

    from farm.db.models import Job, Request
    from farm.db.session import session_scope
    from farm.readers.report_html import CHECK_JS, render
    from tests.farm.results_data import seed_request

    model = "<script>alert(1)</script>[/bold].onnx"
    rid = seed_request(np.random.default_rng(3), model=model)
    with session_scope() as s:
        s.execute(update(Request).where(Request.id == rid).values(name="<b onmouseover=alert(2)>[/]"))
        s.execute(update(Job).where(Job.request_id == rid, Job.status == "failed")
                  .values(error='<img src=x onerror="alert(3)"> [/red] \x1b[2J'))
    page = render(rid)
    assert page.count("<script") == 1 and f"<script>{CHECK_JS}</script>" in page
    assert "<img" not in page and "<b onmouseover" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;[/bold].onnx" in page
    assert "&lt;img src=x onerror=&quot;alert(3)&quot;&gt;" in page
    for args in (("report", rid), ("results", rid), ("status", rid)):
        code, out, err = _farm(capsys, *args)
        assert code == 0 and "\x1b" not in out, (args, err)

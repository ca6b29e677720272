"""The README stays short and true: at most 150 lines, exactly the two set-up commands (the demo on the
embedded default and ``scripts/test``), the first of which runs; links to docs pages that exist; and the
operators' settings table (docs/operators.md) lists every setting (``farm.settings.Settings``) as its
environment variable."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from farm.settings import Settings
from tests.chart import REPO
from tests.test_docs_snippets import IMAGE_TAG, blocks

INSTALL = "pip install -e . && "
#: the pages this README links to that are written in this branch (others arrive with their own issues)
OWN_PAGES = ("requests", "search", "edge", "reports", "metrics", "measurement", "cluster", "operators",
             "model-analyzer", "architecture")


def test_every_setting_is_in_the_operators_settings_table() -> None:
    text = (REPO / "docs" / "operators.md").read_text()
    table = text[text.index("## Settings"):]
    listed = set(re.findall(r"^\| `(FARM_[A-Z0-9_]+)` \|", table, flags=re.M))
    wanted = {f"FARM_{name.upper()}" for name in Settings.model_fields}
    assert wanted <= listed, f"missing from docs/operators.md's settings table: {sorted(wanted - listed)}"


def test_readme_is_short_and_gives_exactly_the_two_set_up_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    commands = [b.body for b in blocks(REPO / "README.md")]
    assert len(commands) == 2, commands
    assert commands[0].startswith(INSTALL + "farm example-model demo.onnx") and "farm submit demo.onnx" in commands[0]
    assert commands[1] == "scripts/test"
    assert (REPO / "scripts" / "test").stat().st_mode & 0o111, "scripts/test must be executable"


def test_readme_links_to_the_docs_pages() -> None:
    text = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\(docs/([a-z0-9-]+)\.md\)", text))
    assert set(OWN_PAGES) <= linked
    for name in OWN_PAGES:
        assert (REPO / "docs" / f"{name}.md").is_file(), f"README links docs/{name}.md, which is missing"


@pytest.mark.slow
def test_the_readme_demo_command_runs_on_the_embedded_default(tmp_path: Path) -> None:
    """The first set-up command, past its ``pip install -e .`` (the suite runs in that installed
    environment), in a scratch FARM_HOME: four jobs, all succeeded."""
    command = blocks(REPO / "README.md")[0].body
    assert command.startswith(INSTALL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_HOME=str(tmp_path / "home"), COLUMNS="200",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if IMAGE_TAG:
        env["FARM_IMAGE_TAG"] = IMAGE_TAG
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command[len(INSTALL):]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4 jobs" in done.stdout + done.stderr
    # each job's live headline (stderr) says whether it succeeded: four ticks, no failure
    assert done.stderr.count("✓ ") == 4 and "✗" not in done.stderr, done.stderr[-3000:]
    assert "failed" not in done.stdout, done.stdout[-3000:]  # the table shows a status column only for failures

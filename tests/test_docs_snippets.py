"""Every ```bash block of README.md and docs/*.md runs, so the commands readers copy work.

A block preceded by ``<!-- snippet: skip (reason) -->`` is left out (it needs a cluster, a GPU, a long run
or installs software). The blocks of one page run in order in one bash process (``set -euo pipefail``), in a
scratch directory with a scratch ``FARM_HOME`` and the embedded default (no FARM_* setting but the local
image's tag), so a later block may use a file or a variable an earlier one made, as a reader would."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.metrics import METRICS
from tests.chart import REPO

SKIP_LINE = re.compile(r"^<!-- snippet: skip \((?P<reason>[^)]+)\) -->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
IMAGE_TAG = os.environ.get("FARM_IMAGE_TAG")  # read at import: the autouse fixture clears FARM_* per test
PAGE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    body: str
    skip: str | None  # the reason, when marked


def blocks(page: Path) -> list[Block]:
    """The ```bash blocks of ``page`` with their skip reasons (the marker must be the line before the fence)."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        if fence["lang"] == "bash":
            marker = SKIP_LINE.match(lines[i - 1]) if i > 0 else None
            out.append(Block(page, i + 1, "\n".join(lines[i + 1:end]), marker["reason"] if marker else None))
        i = end + 1
    return out


def _script(runnable: list[Block]) -> str:
    parts = ["set -euo pipefail"]
    for b in runnable:
        parts.append(f"echo '### {b.page.relative_to(REPO)}:{b.line}' >&2")
        parts.append(b.body)
    return "\n".join(parts) + "\n"


RUNNABLE = {p: [b for b in blocks(p) if b.skip is None] for p in PAGES}


def test_skip_markers_sit_right_before_a_bash_block_and_give_a_reason() -> None:
    for page in PAGES:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines):
            if "snippet: skip" in line:
                assert SKIP_LINE.match(line), f"{page.name}:{n + 1}: write <!-- snippet: skip (reason) -->"
                assert n + 1 < len(lines) and lines[n + 1] == "```bash", \
                    f"{page.name}:{n + 1}: the skip marker must be the line right before a ```bash fence"


def test_blocks_are_found_with_their_markers(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("text\n```bash\necho one\n```\n<!-- snippet: skip (needs a GPU) -->\n```bash\nnvidia-smi\n```\n"
                    "```text\nnot run\n```\n```sql\nSELECT 1;\n```\n")
    found = blocks(page)
    assert [(b.line, b.body, b.skip) for b in found] == [(2, "echo one", None), (6, "nvidia-smi", "needs a GPU")]


def test_every_metric_is_in_the_metrics_page() -> None:
    text = (REPO / "docs" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \|", text, flags=re.M))
    missing = sorted({m.name for m in METRICS} - listed)
    assert not missing, f"missing from docs/metrics.md's metric table: {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if RUNNABLE[p]], ids=lambda p: p.name)
def test_the_bash_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_HOME=str(tmp_path / "home"), COLUMNS="120",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if IMAGE_TAG:
        env["FARM_IMAGE_TAG"] = IMAGE_TAG
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(["bash", "-c", _script(RUNNABLE[page])], cwd=work, env=env, capture_output=True,
                          text=True, timeout=PAGE_TIMEOUT_S)
    assert done.returncode == 0, f"{page.name}: a block failed (the last ### line names it):\n" \
                                 f"{done.stderr[-4000:]}\n{done.stdout[-2000:]}"

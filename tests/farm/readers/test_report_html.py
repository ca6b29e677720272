"""`farm report REQUEST_ID -o report.html`: one self-contained file whose numbers equal the database's, that
opens offline in headless Chromium (Debian's ``chromium``) with every plot rendered and no network request."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from farm.db.session import get_engine
from schemas.metrics import JOB_METRICS
from tests.farm.results_data import seed_request
from tests.helpers import farm

PLOTS = {"throughput-p99", "batch", "e2e-compute", "resources", "edge", "cdf"}


@pytest.fixture
def report(sqlite_url: str, tmp_path: Path) -> tuple[str, Path]:
    """(request id, report file) of a seeded request with serving, GPU, failed and edge jobs."""
    rid = seed_request(np.random.default_rng(8))
    out = tmp_path / "report.html"
    farm("report", rid, "--p99", "20", "-o", str(out))
    return rid, out


def test_the_report_holds_every_job_with_the_database_numbers_and_fetches_nothing(
        report: tuple[str, Path], sqlite_url: str) -> None:
    rid, path = report
    page = path.read_text()
    cells = re.findall(r'<tr data-job="(\w+)">(.*?)</tr>', page, flags=re.S)
    cols = ", ".join(f"r.{m.name}" for m in JOB_METRICS)
    with get_engine(sqlite_url).connect() as conn:
        db = {r["id"]: dict(r) for r in conn.execute(text(
            f"SELECT j.id, {cols} FROM jobs j LEFT JOIN results r ON r.job_id = j.id WHERE j.request_id = :r"),
            {"r": rid}).mappings()}
    assert {job for job, _ in cells} == set(db)
    for job, row in cells:
        shown = dict(re.findall(r'data-metric="(\w+)" data-value="([^"]*)"', row))
        assert set(shown) == {m.name for m in JOB_METRICS}
        for m in JOB_METRICS:
            stored = db[job][m.name]
            if stored is None:
                assert shown[m.name] == ""
            elif m.kind == "bool":
                assert shown[m.name] == str(bool(stored))
            else:
                assert float(shown[m.name]) == float(stored), (m.name, shown[m.name], stored)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.findall(r'(?:src|href)="(?!#|data:)[^"]*"', page)  # nothing to load: inline SVG and CSS only
    assert "in-process" in page and "over gRPC" in page and "does not fit" in page  # how measured; OOM edge
    shown_text = html.unescape(page)
    assert "engine tensorrt needs a GPU" in shown_text and "violates latency_p99_ms <= 20" in shown_text  # left out


class Chromium:
    """Headless Chromium runs on local files with a throw-away profile and a net log per run."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.runs = tmp, 0

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.tmp / "profiles", ignore_errors=True)

    def run(self, page: Path, *args: str) -> tuple[str, Path]:
        """(stdout, net log file) of one run of chromium on ``page`` with ``args``."""
        self.runs += 1
        netlog = self.tmp / f"netlog-{self.runs}.json"
        proc = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={self.tmp / 'profiles' / str(self.runs)}", f"--log-net-log={netlog}",
             "--window-size=1400,3000", *args, page.as_uri()],
            capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout, netlog


def page_requests(netlog: Path) -> list[str]:
    """URLs the page asked for: requests with an initiator (the browser's own, e.g. update checks, have
    none: 'not an origin'), other than local files and data URLs."""
    log: dict[str, Any] = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [p["url"] for e in log["events"] if e["type"] == start and "url" in (p := e.get("params", {}))
            and p.get("initiator") != "not an origin" and not p["url"].startswith(("file:", "data:"))]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (scripts/test "
                                                                "installs it)")
def test_the_report_renders_offline_in_headless_chromium(report: tuple[str, Path], tmp_path: Path) -> None:
    from PIL import Image

    _, path = report
    with Chromium(tmp_path) as chromium:
        shot = tmp_path / "report.png"
        chromium.run(path, f"--screenshot={shot}")
        dom, netlog = chromium.run(path, "--dump-dom")
        assert page_requests(netlog) == []
        probe = tmp_path / "probe.html"  # the same check sees a page that does fetch something
        probe.write_text('<html><body><img src="http://127.0.0.1:9/pixel.png"></body></html>')
        _, probe_log = chromium.run(probe, "--dump-dom")
        assert page_requests(probe_log) == ["http://127.0.0.1:9/pixel.png"]
    assert 'data-checked="1"' in dom  # the page's own script ran after layout
    figures = dict(re.findall(r'<figure class="plot" id="plot-([\w-]+)" data-rendered="(\d+x\d+)"', dom))
    assert set(figures) == PLOTS
    for size in figures.values():
        width, height = map(int, size.split("x"))
        assert width > 300 and height > 150, figures
    marks = [int(m) for m in re.findall(r'data-marks="(\d+)"', dom)]
    assert len(marks) == len(PLOTS) and min(marks) > 20
    with Image.open(shot) as img:
        assert img.size == (1400, 3000)
        grey = np.asarray(img.convert("L"))
    assert (grey < 200).mean() > 0.02  # text, axes and lines drawn, not a blank page


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (scripts/test "
                                                                "installs it)")
def test_the_report_reads_well_in_a_1400_px_window(report: tuple[str, Path], tmp_path: Path) -> None:
    """As rendered in Chromium at 1,400 px: every plot's smallest text at least 11 px, no plot wider than the
    window, the "Every job" table's metric columns within the window (no horizontal scroll), axis labels
    from the metric registry, log ticks in plain numbers, large integers with thousands separators."""
    _, path = report
    page = path.read_text()
    with Chromium(tmp_path) as chromium:
        dom, _ = chromium.run(path, "--dump-dom")
        chromium.run(path, f"--screenshot={tmp_path / 'report.png'}")
    fonts = dict(re.findall(r'<figure class="plot" id="plot-([\w-]+)"[^>]*data-min-font="([\d.]+)"', dom))
    assert set(fonts) == PLOTS
    assert min(float(v) for v in fonts.values()) >= 11.0, fonts
    sizes = dict(re.findall(r'<figure class="plot" id="plot-([\w-]+)" data-rendered="(\d+)x\d+"', dom))
    assert max(int(w) for w in sizes.values()) <= 1400 - 40, sizes
    right, window = map(int, re.search(r'data-jobs-width="(\d+)/(\d+)"', dom).groups())  # type: ignore[union-attr]
    assert right <= window, (right, window)
    summary = page[page.index('id="jobs-summary"'):page.index('id="all-metrics"')]
    assert ">infer/s<" in summary and ">p99 ms<" in summary and "over gRPC" not in summary
    svg_text = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", page))
    assert "throughput (infer/s)" in svg_text and "p99 latency (ms)" in svg_text
    assert "infer per s" not in svg_text and "latency p99" not in svg_text
    assert "10^" not in page and "\\times" not in page and "×10" not in svg_text  # no mathtext log ticks
    assert re.search(r">\d{1,3}(,\d{3})+<", page), "large integers carry thousands separators"

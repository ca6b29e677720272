"""``farm events JOB`` end to end against the fake OpenAI server (known script: reasoning, content and tool-call
tokens, a known count per chunk): the event counts, the Parquet schema and units, each tool's figures against a hand
computation from the exported events, the server's own log of what it sent, ``farm results --wide`` and the
report's section."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.fake_openai import fake_server, read_log
from tests.helpers import farm, farm_env
from workers.loadgen.openai.load_loop import request_seq

OUT = 8  # tokens per answer: 3 reasoning, 3 content, 2 tool-call
LLM = ["--duration", "1", "--window", "0.5", "--warmup", "0.3", "--input-tokens", "16", "--output-tokens", str(OUT)]


def _hand(events: list[dict[str, object]]) -> dict[str, float]:
    """One request's figures computed by hand from its exported events (ms), by each tool's written definition."""
    t = {e["event"]: e["t_ms"] for e in events if e["event"] != "chunk"}
    chunks = [e for e in events if e["event"] == "chunk"]
    first, last = float(chunks[0]["t_ms"]), float(chunks[-1]["t_ms"])  # type: ignore[arg-type]
    n = sum(int(c["tokens"]) for c in chunks)  # type: ignore[call-overload]
    sent, sched, end = float(t["sent"]), float(t["scheduled"]), float(t["end"])  # type: ignore[arg-type]
    return {"ttft_ms_farm": first - sched, "ttft_ms_vllm": first - sent, "ttft_ms_aiperf": first - sent,
            "ttft_ms_guidellm": first - sent, "tpot_ms_vllm": (last - first) / (n - 1),
            "itl_ms_aiperf": (last - first) / (n - 1), "itl_ms_guidellm": (last - first) / (n - 1),
            "tpot_ms_guidellm": (last - sent) / n, "tpot_ms_farm": (max(end, last) - first) / (n - 1)}


def test_events_export_and_tools_side_by_side(tmp_path: Path) -> None:
    env = farm_env()
    log_path = tmp_path / "server.jsonl"
    with fake_server(log=log_path, model="tiny", ttft_ms=8, itl_ms=2, reasoning=3, tool_tokens=2) as url:
        out = farm("submit", "--endpoint", url, "--api", "openai-chat", "--model-name", "tiny", "--concurrency", "2",
                   *LLM, "--json", env=env)
    rid = json.loads(out.stdout)["request_id"]
    (row,) = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    ev, rq = tmp_path / "events.parquet", tmp_path / "requests.parquet"
    got = json.loads(farm("events", row["job_id"][:10], "--parquet", str(ev), "--requests-parquet", str(rq),
                          "--json", env=env).stdout)
    assert got["requests"] >= got["measured"] > 0 and got["chunks"] == got["chunks_logged"] and not got["cut"]

    events = pq.read_table(ev)
    # units: in the column names and as field metadata; the tools' figures and the log's origin in the schema's
    assert events.schema.field("t_ms").metadata == {b"unit": b"ms"}
    assert events.schema.field("tokens").metadata == {b"unit": b"tokens"}
    assert json.loads(events.schema.metadata[b"farm.tool_figures"])[0]["tool"] == "farm"
    requests = pq.read_table(rq)
    assert all(requests.schema.field(c).metadata == {b"unit": b"ms"} for c in requests.column_names
               if c.endswith("_ms_vllm") or c.endswith("_ms_farm"))

    by_req: dict[int, list[dict[str, object]]] = {}
    for e in events.to_pylist():
        by_req.setdefault(int(e["request_seq"]), []).append(e)
    figures = {int(r["request_seq"]): r for r in requests.to_pylist()}
    complete = [s for s, r in figures.items() if r["error"] is None]
    assert complete
    for seq in complete:
        evs = by_req[seq]
        kinds = [e["kind"] for e in evs if e["event"] == "chunk"]
        # the fake streams one token a chunk: 3 reasoning, then content, then 2 tool-call tokens
        assert kinds == ["reasoning"] * 3 + ["content"] * 3 + ["tool"] * 2
        assert [e["event"] for e in evs][:3] == ["scheduled", "sent", "first_byte"] and evs[-1]["event"] == "end"
        assert len(evs) == 3 + OUT + 1
        since = [float(e["since_sent_ms"]) for e in evs[1:]]  # type: ignore[arg-type]
        assert since == sorted(since) and since[0] == 0.0  # sent, its head, its chunks and its end, in order
        for column, value in _hand(evs).items():
            assert figures[seq][column] == pytest.approx(value, abs=1e-6), column

    # the summary's p50s are those of the measured requests' hand figures
    measured = [s for s in complete if not figures[s]["warm"]]
    vllm_tpot = [_hand(by_req[s])["tpot_ms_vllm"] for s in measured]
    summary = {(f["figure"], f["tool"]): f for f in got["figures"]}
    assert summary[("tpot", "vllm")]["p50"] == pytest.approx(float(np.percentile(vllm_tpot, 50)), abs=1e-6)
    assert summary[("tpot", "vllm")]["n"] == len(measured)

    # the server's log of what it wrote: as many chunks as the client logged, each written before it arrived
    for entry in read_log(log_path):
        seq = request_seq(entry["rid"])
        if seq in complete:
            chunks = [e for e in by_req[seq] if e["event"] == "chunk"]
            assert entry["n"] == len(chunks) == OUT

    wide = farm("results", rid, "--wide", env=env).stdout
    assert f"job {row['job_id'][:8]} p50 ms by farm | vllm | aiperf | guidellm: TTFT" in " ".join(wide.split())
    page = tmp_path / "report.html"
    farm("report", rid, "-o", str(page), env=env)
    html = page.read_text()
    assert 'id="tools-table"' in html and f"<code>{row['job_id'][:8]}</code></td><td class=l>TPOT p50 ms" in html


def test_events_of_a_job_without_a_log_is_a_one_line_error() -> None:
    env = farm_env()
    bad = farm("events", "zz", env=env, check=False)
    assert bad.returncode != 0 and "not a job id" in bad.stderr and "Traceback" not in bad.stderr

"""``farm report`` explains the knee of a real concurrency sweep: farm launches llama.cpp's ``llama-server`` with one
slot (``n_parallel=1``) and sweeps concurrency 1, 2, 4, 8; past the knee the server runs one request while the rest
wait in its queue, which the report names as what bounds the sweep ("the queue grows at constant running requests
(slots ...)") with the server's own figures, and splits each job's TTFT into the server's queue + prefill and the
rest, in the text report and as stacked bars in the HTML report."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import farm, farm_env

pytestmark = pytest.mark.llm


def test_one_slot_of_llama_server_bounds_the_sweep_and_the_report_names_it(llama_server: str, tiny_llama: Any,
                                                                          tmp_path: Path) -> None:
    env = farm_env()
    out = farm("submit", str(tiny_llama.gguf), "--engine", "llama.cpp", "--concurrency", "1,2,4,8", "--knob",
               "n_parallel=1", "--duration", "2", "--window", "1", "--warmup", "0.5", "--input-tokens", "24",
               "--output-tokens", "32", "--json", env=env, timeout=600)
    rid = json.loads(out.stdout)["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    assert [r["status"] for r in rows] == ["succeeded"] * 4, [r.get("error") for r in rows]
    assert {r["server_requests_running_max"] for r in rows} == {1}  # one slot: never more than one running
    text = " ".join(farm("report", rid, env=env).stdout.split())
    knee = re.search(r"cpu llama\.cpp n_parallel=1: knee at c=(\d): [\d,]+ tok/s; bounded by: the queue grows at "
                     r"constant running requests \(slots / max_num_seqs\): requests running \(mean/max\) [\d.]+/1 → "
                     r"[\d.]+/1 of 1 slots, waiting \(mean\) ([\d.]+) → ([\d.]+) \(c=\d → c=\d\)", text)
    assert knee is not None, text
    assert float(knee.group(3)) - float(knee.group(2)) >= 0.2
    assert re.search(r"TTFT split, cpu llama\.cpp n_parallel=1 c=8: TTFT p50 [\d.,]+ ms = queue [\d.,]+ \(Little's "
                     r"law mean\) \+ prefill [\d.,]+ \(timings p50\) \+ rest [\d.,]+ ms", text), text
    data = json.loads(farm("report", rid, "--json", env=env).stdout)
    (cause,) = [c for c in data["knee_causes"] if c["by"] == "concurrency"]
    assert [b["cause"] for b in cause["bound_by"]][0] == "slots"
    splits = {s["concurrency"]: s for s in data["ttft_split"]}
    assert splits[8]["queue_ms"] > splits[1]["queue_ms"] and splits[8]["prefill_ms"] > 0
    page = tmp_path / "report.html"
    farm("report", rid, "-o", str(page), env=env)
    shown = page.read_text()
    assert 'data-bound-by="slots' in shown and 'id="ttft-split"' in shown
    assert len(re.findall(r'<span class="tq" data-part="queue" style="width:[\d.]+%"', shown)) >= 3

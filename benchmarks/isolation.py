"""Isolation on one host: four jobs of a compute-bound model measured alone (one `farm worker`), then by two
`farm worker` processes on the same host with core leases (FARM_ISOLATION on, the default) and without
(FARM_ISOLATION=off). Each round runs alone (A), isolated (B), alone again (A2): each job's
throughput B / mean(A, A2) per round, and the A2/A ratio as the yardstick of the host's own run-to-run
noise; whether results say they shared the host, the request's wall time per run, and the steal. Target: every
isolated job within 10 % of alone; without isolation the shared host shows (issue 12: 3x lower).
Services: Postgres and Redis on 127.0.0.1 (as in CI)."""
from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from _scale_common import scratch_cluster, start_workers, wait_workers_online
from _serve import ROOT, Steal, steal_flag

CONFIGS = ([1, 8], [1, 4])  # batch sizes x concurrency: four jobs


def run_request(model: Path, workers: int, tmp: Path, measurement: dict[str, Any],
                **settings: str) -> tuple[dict[tuple[int, int], dict[str, Any]], float, float, float]:
    """Submit the four jobs to ``workers`` fresh `farm worker` processes on this host; returns each job's
    result row by (batch, concurrency), the request's wall time (submit to last result) in s, steal % and
    the host's 1-minute load average at the end (other work on the host shows there)."""
    tmp.mkdir(parents=True, exist_ok=True)
    lock_dir = tmp / "host"
    with scratch_cluster(FARM_HEARTBEAT_S="1", FARM_HOST_LOCK_DIR=str(lock_dir), PYTHONPATH=str(ROOT),
                         **settings) as env:
        from farm.readers.results import result_rows
        from scheduler.enqueue import submit
        from schemas import MeasurementSettings, ProfileRequest
        from schemas.job import FINAL

        logs = tmp / "logs"
        logs.mkdir()
        procs = start_workers(workers, env, logs)
        try:
            wait_workers_online(workers)
            time.sleep(2.0)  # the Celery consumers subscribe just after registration
            with Steal() as steal:
                t0 = time.perf_counter()
                sub = submit(ProfileRequest(model=str(model), batch_sizes=CONFIGS[0], concurrency=CONFIGS[1],
                                            measurement=MeasurementSettings(**measurement)))
                rid = sub.request_id
                while True:
                    rows = result_rows(rid)
                    if all(r["status"] in FINAL for r in rows):
                        break
                    if time.perf_counter() - t0 > 600:
                        raise RuntimeError(f"request {rid} not done after 600 s; see {logs}")
                    time.sleep(0.1)
                wall = time.perf_counter() - t0
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=60)
    bad = [r for r in rows if r["status"] != "succeeded"]
    if bad:
        raise RuntimeError(f"jobs failed: {[(r['batch_size'], r['concurrency'], r['error']) for r in bad]}")
    return {(r["batch_size"], r["concurrency"]): r for r in rows}, wall, steal.pct, os.getloadavg()[0]


Runs = dict[tuple[int, int], dict[str, Any]]


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def per_round_ratios(alone_a: list[Runs], iso: list[Runs], alone_b: list[Runs]
                     ) -> tuple[dict[tuple[int, int], list[float]], dict[tuple[int, int], list[float]]]:
    """Per job config and round: the isolated throughput over the mean of the two alone runs around it
    (A, B, A2: drift of the host cancels), and the A/A ratio A2/A, the yardstick for what the host's own
    noise does to a ratio between two runs of the same setup."""
    iso_r: dict[tuple[int, int], list[float]] = {k: [] for k in alone_a[0]}
    aa_r: dict[tuple[int, int], list[float]] = {k: [] for k in alone_a[0]}
    for a, i, b in zip(alone_a, iso, alone_b, strict=True):
        for key in iso_r:
            ta, tb = a[key]["throughput_infer_per_s"], b[key]["throughput_infer_per_s"]
            iso_r[key].append(i[key]["throughput_infer_per_s"] / ((ta + tb) / 2))
            aa_r[key].append(tb / ta)
    return iso_r, aa_r


def spread(values: list[float]) -> str:
    """Median and range of ratios: ``0.97x (0.91-1.02)``."""
    return f"{median(values):4.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short measurements, one round (CI smoke test, < 2 min)")
    ap.add_argument("--ms", type=float, default=2.0, help="compute per sample of the model, ms (single thread)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of alone, isolated, alone again (A, B, A2)")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    measurement: dict[str, Any] = (dict(warmup_s=0.5, window_s=1.0, duration_s=2.0) if args.quick
                                   else dict(warmup_s=2.0, window_s=1.0, duration_s=8.0))
    from farm.models.examples import build_example

    runs: dict[str, list[Runs]] = {"alone": [], "iso": [], "alone2": []}
    walls: dict[str, list[float]] = {"alone": [], "iso": [], "alone2": [], "off": []}
    steal: list[float] = []
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model = build_example("compute", tmp / "compute.onnx", ms=args.ms)
        for i in range(rounds):
            for name, n in (("alone", 1), ("iso", 2), ("alone2", 1)):
                rows, wall, st, load = run_request(model, n, tmp / f"{name}{i}", measurement)
                runs[name].append(rows)
                walls[name].append(wall)
                steal.append(st)
                loads.append(load)
        off, wall_off, st, load = run_request(model, 2, tmp / "off", measurement, FARM_ISOLATION="off")
        walls["off"].append(wall_off)
        steal.append(st)
        loads.append(load)
    iso_r, aa_r = per_round_ratios(runs["alone"], runs["iso"], runs["alone2"])
    last_iso = runs["iso"][-1]
    print(f"isolation: compute model ({args.ms:g} ms/sample), 4 jobs, warm-up {measurement['warmup_s']:g} s + "
          f"{measurement['duration_s']:g} s each, process runner, {len(os.sched_getaffinity(0))} cores, "
          f"{rounds} round(s) of alone (A), 2 workers isolated (B), alone again (A2); ratios per round, "
          "median (range)")
    print(f"{'b x c':>6} {'alone/s':>8} {'B / mean(A, A2)':>22} {'A/A yardstick':>22} "
          f"{'2 workers, FARM_ISOLATION=off':>34}")
    for key in iso_r:
        ta = median([r[key]["throughput_infer_per_s"] for r in runs["alone"] + runs["alone2"]])
        r = off[key]
        t = r["throughput_infer_per_s"]
        flag = "shared!" if r["host_shared"] and r["isolated"] is False else "not flagged"
        shared = "shared" if last_iso[key]["host_shared"] else "alone"
        print(f"{key[0]:>2} x {key[1]:<2} {ta:8.0f} {spread(iso_r[key]):>22} {spread(aa_r[key]):>22} "
              f"{f'{t:.0f} ({t / ta:4.2f}x, {flag})':>34}   [isolated result says: {shared}]")
    for i in range(rounds):
        print(f"round {i + 1} infer/s (A / B / A2): " + ", ".join(
            f"{b}x{c} " + "/".join(f"{runs[n][i][(b, c)]['throughput_infer_per_s']:.0f}" for n in runs)
            for b, c in iso_r))
    med = {k: median(v) for k, v in walls.items()}
    iso_all = [median(v) for v in iso_r.values()]
    aa_all = [median(v) for v in aa_r.values()]
    print(f"request wall time: alone {med['alone']:.1f} s, 2 workers isolated {med['iso']:.1f} s, "
          f"2 workers without isolation {med['off']:.1f} s")
    print(f"isolated jobs (median per job): {min(iso_all):.2f}x to {max(iso_all):.2f}x of alone "
          f"(target: within 0.90-1.10); alone vs alone: {min(aa_all):.2f}x to {max(aa_all):.2f}x")
    print(f"steal: up to {max(steal):.1f} %{steal_flag(max(steal))}; load average after each run: "
          f"{' / '.join(f'{x:.1f}' for x in loads)} (farm's own jobs add 1-2; more means other work shared "
          "the host, and the ratios measure it too)")


if __name__ == "__main__":
    main()

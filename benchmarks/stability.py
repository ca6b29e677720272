"""Do repeated runs of the same job agree? Coefficient of variation of throughput over N runs.

Each run is a whole job: a fresh farm server process, then ``run_load`` with the default measurement
settings (warm-up 1 s, 1 s windows, stop when the last 3 agree within ±10 %, at most 10). Two jobs: an
identity model at concurrency 4 (transport-bound) and a ~5 ms MatMul chain at concurrency 2
(compute-bound). Target: CV of throughput <= 3 %.

Beside each run, the CPU share the hypervisor took meanwhile (steal) is printed, and right after each
job the machine's own speed is timed for as long as the job measured, on the client's and the server's
CPUs at once, with ``host_noise.py``'s two fixed workloads (a pure-Python loop and a random gather over
16 MB). The CV of those yardsticks across the runs is the floor at the job's time scale: when the
machine itself drifts by more than the target (steal, frequency changes or busy neighbours on a shared
host, not all of which the guest sees as steal), no harness can show a lower CV, and the output says so.

Run: ``python benchmarks/stability.py [--quick] [--runs N] [--window S] [--windows N] [--stability PCT]
[--only identity|matmul]``. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from _serve import Steal, farm_server, identity_model, machine_speed, matmul_chain_model, pin, split_cpus  # noqa: I001
from host_noise import cv_pct

from schemas import MeasurementSettings, TensorSpec
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget


def run_job(model: Path, shape: tuple[int, ...], conc: int, settings: MeasurementSettings,
            cpu_sets: tuple[set[int] | None, set[int] | None]) -> tuple[dict[str, object], tuple[float, float]]:
    """One job: start a server for ``model``, measure, stop it. Returns (metrics with ``steal_pct``,
    machine speed right after, timed for as long as the job's measured windows: loop M it/s, gather
    M elements/s)."""
    with Steal() as st, farm_server(model, threads=1, cpu_set=cpu_sets[1]) as url:
        r = run_load(LoadTarget(url, "model"),
                     LoadSpec.from_settings([TensorSpec(name="x", shape=shape)], 1, conc, settings), processes=1)
    speed = machine_speed(list(cpu_sets), float(r.metrics["duration_s"]))  # type: ignore[arg-type]
    return {**r.metrics, "steal_pct": st.pct}, speed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 short runs for a CI smoke test")
    ap.add_argument("--runs", type=int, default=None, help="runs per job (default 5, quick 3)")
    ap.add_argument("--window", type=float, default=None, help="window length, s (default: farm's, 1 s)")
    ap.add_argument("--windows", type=int, default=None, help="at most this many windows (default 10)")
    ap.add_argument("--stability", type=float, default=None, help="stability band, ± %% (default 10)")
    ap.add_argument("--only", choices=("identity", "matmul"), default=None, help="run one job only")
    args = ap.parse_args()
    runs = args.runs or (3 if args.quick else 5)
    # farm's own generator: its windows extend until stable (perf_analyzer's run a fixed count), and it reads
    # the server's per-request compute time
    settings = (MeasurementSettings(client="farm", warmup_s=0.3, window_s=0.3, min_windows=3, max_windows=5)
                if args.quick else MeasurementSettings(client="farm"))
    given = {"window_s": args.window, "max_windows": args.windows, "stability_pct": args.stability}
    settings = MeasurementSettings.model_validate(
        {**settings.model_dump(), **{k: v for k, v in given.items() if v is not None}})
    client_cpus, server_cpus = split_cpus()
    pin(client_cpus)
    print(f"{runs} runs per job; settings: warm-up {settings.warmup_s} s, windows {settings.window_s} s, "
          f"min {settings.min_windows}, max {settings.max_windows}, ±{settings.stability_pct:g} %; "
          f"client CPUs {sorted(client_cpus or [])}, server CPUs {sorted(server_cpus or [])}")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        jobs = [
            ("identity [1,16], c=4", identity_model(tmp / "identity.onnx", (16,)), (16,), 4),
            ("MatMul chain 25x[256,256], c=2", matmul_chain_model(tmp / "chain.onnx", 25, 256), (256, 256), 2),
        ]
        for name, model, shape, conc in jobs:
            if args.only and not name.lower().startswith(args.only):
                continue
            done = [run_job(model, shape, conc, settings, (client_cpus, server_cpus)) for _ in range(runs)]
            rows = [m for m, _ in done]
            speed = np.array([v for _, v in done])  # (runs, 2): loop, gather
            tput = np.array([float(m["throughput_infer_per_s"]) for m in rows])  # type: ignore[arg-type]
            p50 = np.array([float(m["latency_p50_ms"]) for m in rows])  # type: ignore[arg-type]
            p99 = np.array([float(m["latency_p99_ms"]) for m in rows])  # type: ignore[arg-type]
            comp = np.array([float(m["server_compute_p50_ms"]) for m in rows])  # type: ignore[arg-type]
            print(f"\n{name}")
            for i, (m, v) in enumerate(done):
                t, a, b = (float(m[k]) for k in ("throughput_infer_per_s", "latency_p50_ms",  # type: ignore[arg-type]
                                                 "latency_p99_ms"))
                print(f"  run {i + 1}: {t:9.1f} infer/s  p50 {a:7.3f} ms  p99 {b:7.3f} ms  "
                      f"server compute p50 {float(m['server_compute_p50_ms']):6.3f} p99 "  # type: ignore[arg-type]
                      f"{float(m['server_compute_p99_ms']):6.3f} ms  "  # type: ignore[arg-type]
                      f"windows {m['windows']}  stable {m['stable']}  host steal {m['steal_pct']:.1f} %  "
                      f"machine: loop {v[0]:.1f}, gather {v[1]:.0f}")
            print(f"  throughput mean {tput.mean():.1f} infer/s, CV {cv_pct(tput):.2f} % (target <= 3 %); "
                  f"p50 CV {cv_pct(p50):.2f} %, p99 CV {cv_pct(p99):.2f} %; server compute p50 CV "
                  f"{cv_pct(comp):.2f} % (the model's own arithmetic: it moves with the machine, not the harness)")
            loop_cv, gather_cv = cv_pct(speed[:, 0]), cv_pct(speed[:, 1])
            print(f"  machine yardsticks, timed after each job for as long as it measured: "
                  f"loop {speed[:, 0].mean():.1f} M it/s CV {loop_cv:.2f} %, "
                  f"gather {speed[:, 1].mean():.0f} M elements/s CV {gather_cv:.2f} %"
                  + ("  <- the machine drifts more than the target; rerun on a quiet machine"
                     if max(loop_cv, gather_cv) > 3 else ""))


if __name__ == "__main__":
    main()

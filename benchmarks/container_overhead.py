"""What does a container cost per job? Start + model load until ModelReady, with and without reuse.

Measures, on the local Docker daemon with the locally built runtime image (``workers.images``):

1. image build: first call (may build) and a cached call (content hash unchanged);
2. ``DockerRunner.serve()`` entry (container create/start on the internal network, server start, model load,
   ServerReady + ModelReady) for ``--jobs`` consecutive jobs with ``reuse=False`` (a container per job);
3. the same with ``reuse=True`` (first job starts the container, later jobs reuse it);
4. teardown (leaving ``serve()``: stop + remove, or keep);
5. an edge run of ``--edge-duration-s`` seconds: total container time minus the measured loop.

Run: ``python benchmarks/container_overhead.py [--jobs 5] [--model mlp|convnet] [--quick]``. Prints
figures; asserts nothing; prints ``skipped`` when no Docker daemon answers.
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from farm.models.examples import build_example  # noqa: E402
from schemas import EdgeProfile, JobSpec, MeasurementSettings  # noqa: E402


def _spec(model: Path, edge: EdgeProfile | None = None, **m: object) -> JobSpec:
    return JobSpec(job_id=f"bench-{uuid.uuid4().hex[:8]}", request_id="bench",
                   model_sha256=hashlib.sha256(model.read_bytes()).hexdigest(), model_format="onnx",
                   inputs=[], device="cpu", engine="onnxruntime", batch_size=1, concurrency=1,
                   edge_profile=edge, queue="cpu", measurement=MeasurementSettings(**m))


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    return (f"mean {1000 * statistics.fmean(xs):7.1f} ms  median {1000 * statistics.median(xs):7.1f} ms  "
            f"min {1000 * min(xs):7.1f} ms  max {1000 * max(xs):7.1f} ms  (n={len(xs)})")


def _serve_times(runner: object, model: Path, jobs: int) -> tuple[list[float], list[float], set[str]]:
    enter, leave, ids = [], [], set()
    for _ in range(jobs):
        t0 = time.perf_counter()
        cm = runner.serve(_spec(model, threads=1), model)  # type: ignore[attr-defined]
        target = cm.__enter__()
        t1 = time.perf_counter()
        ids.add(target.container_id)
        cm.__exit__(None, None, None)
        t2 = time.perf_counter()
        enter.append(t1 - t0)
        leave.append(t2 - t1)
    return enter, leave, ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--model", default="mlp", choices=["mlp", "convnet", "identity"])
    p.add_argument("--edge-duration-s", type=float, default=2.0)
    p.add_argument("--quick", action="store_true", help="2 jobs, 1 s edge loop (CI smoke run)")
    a = p.parse_args(argv)
    if a.quick:
        a.jobs, a.edge_duration_s = min(a.jobs, 2), 1.0
    try:
        import docker

        docker.from_env(timeout=10).ping()
    except Exception as exc:
        print(f"skipped: no Docker daemon answers ({exc})")
        return 0

    from workers.images import DEFAULT_TAG, build_local_image
    from workers.runners.docker import DockerRunner

    t = time.perf_counter()
    build_local_image(DEFAULT_TAG, ROOT)
    first_build = time.perf_counter() - t
    t = time.perf_counter()
    build_local_image(DEFAULT_TAG, ROOT)
    cached_build = time.perf_counter() - t
    print(f"image {DEFAULT_TAG}: first call {first_build:.2f} s (built if the content changed), "
          f"cached call {cached_build:.2f} s")

    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        Path(tmp).chmod(0o755)
        model = build_example(a.model, Path(tmp) / f"{a.model}.onnx")
        model.chmod(0o644)
        wid = f"bench-{uuid.uuid4().hex[:6]}"
        with DockerRunner(worker_id=wid, reuse=False) as r:
            enter, leave, ids = _serve_times(r, model, a.jobs)
        print(f"\nno reuse ({len(ids)} containers for {a.jobs} jobs, model {a.model}):")
        print(f"  start + load to ModelReady: {_fmt(enter)}")
        print(f"  stop + remove:              {_fmt(leave)}")
        with DockerRunner(worker_id=wid, reuse=True, idle_timeout_s=60) as r:
            enter_r, leave_r, ids_r = _serve_times(r, model, a.jobs)
        print(f"\nreuse ({len(ids_r)} container(s) for {a.jobs} jobs):")
        print(f"  first job (cold start):     {_fmt(enter_r[:1])}")
        print(f"  later jobs (reused):        {_fmt(enter_r[1:])}")
        print(f"  leave (kept):               {_fmt(leave_r)}")
        if enter and enter_r[1:]:
            saved = statistics.fmean(enter) - statistics.fmean(enter_r[1:])
            print(f"  saved per reused job:       {1000 * saved:.1f} ms")

        with DockerRunner(worker_id=wid) as r:
            spec = _spec(model, EdgeProfile(cpus=1, memory="512m"), warmup_s=0.2, duration_s=a.edge_duration_s)
            t = time.perf_counter()
            res = r.run_edge(spec, model)
            wall = time.perf_counter() - t
        d = res.details
        loop = float(res.metrics.get("duration_s") or 0.0) + 0.2
        print(f"\nedge run (cpus=1, 512m, {a.edge_duration_s:g} s loop + 0.2 s warm-up): wall {wall:.2f} s, "
              f"container {d['total_time_s']:.2f} s, model load {d['bench']['load_s'] * 1000:.0f} ms, "
              f"overhead beyond the loop {wall - loop:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Submitting a 10,000-job matrix: inspect, expand, store (bulk insert) and enqueue (one Redis pipeline).

Target: < 3 s end to end (`scheduler.enqueue.submit`). Prints the split: plan (inspect + expand), store
(model + request + jobs, one transaction) and enqueue (broker + enqueued_at stamp).

    python benchmarks/scale_submit.py [--quick] [--jobs 10000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _scale_common import example_model, scratch_cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a small run (CI smoke test)")
    args = ap.parse_args()
    if args.quick:
        args.jobs, args.repeat = 2000, 1
    side = 100
    batches, conc = list(range(1, side + 1)), list(range(1, args.jobs // side + 1))
    with tempfile.TemporaryDirectory() as tmp, scratch_cluster(FARM_JOB_LIMIT=str(args.jobs)):
        import redis
        from sqlalchemy import func, select

        from farm.broker import get_app
        from farm.db.models import Job
        from farm.db.session import session_scope
        from farm.settings import get_settings
        from scheduler import enqueue
        from schemas import ProfileRequest

        model = example_model(Path(tmp))
        request = ProfileRequest(model=str(model), batch_sizes=batches, concurrency=conc)
        timings: dict[str, list[float]] = {"plan": [], "store": [], "enqueue": [], "total": []}
        orig_plan, orig_enqueue = enqueue.plan, enqueue.enqueue_jobs

        def timed(name, fn):  # type: ignore[no-untyped-def]
            def wrapper(*a, **k):  # type: ignore[no-untyped-def]
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    timings[name].append(time.perf_counter() - t)
            return wrapper

        enqueue.plan = timed("plan", orig_plan)
        enqueue.enqueue_jobs = timed("enqueue", orig_enqueue)
        client = redis.Redis.from_url(get_settings().broker_url)
        for _ in range(args.repeat):
            get_app()  # the Celery app is built once per process, not per submission
            t0 = time.perf_counter()
            sub = enqueue.submit(request)
            total = time.perf_counter() - t0
            timings["total"].append(total)
            timings["store"].append(total - timings["plan"][-1] - timings["enqueue"][-1])
            with session_scope() as s:
                stored = s.scalar(select(func.count()).select_from(Job).where(Job.request_id == sub.request_id,
                                                                              Job.enqueued_at.is_not(None)))
            assert stored == len(sub.expansion.jobs) == args.jobs, (stored, len(sub.expansion.jobs))
        queued = client.llen("farm.cpu")
    med = {k: statistics.median(v) for k, v in timings.items()}
    print(f"submit {args.jobs} jobs (median of {args.repeat}): total {med['total']:.2f} s = plan "
          f"{med['plan']:.2f} s + store {med['store']:.2f} s + enqueue {med['enqueue']:.2f} s; "
          f"best total {min(timings['total']):.2f} s; {queued} messages on the broker")


if __name__ == "__main__":
    main()

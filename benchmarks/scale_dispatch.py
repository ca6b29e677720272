"""Dispatch throughput: no-op jobs through Redis + Postgres with two real ``farm worker`` processes.

Workers run with FARM_NOOP_JOBS=1 (the dispatch harness: claim, mark running, write a result row, ack;
nothing is served). Measures jobs/s from the submit until every job is final. Target: >= 300 jobs/s.

    python benchmarks/scale_dispatch.py [--quick] [--jobs 3000] [--workers 2]
"""
from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path

from _scale_common import example_model, scratch_cluster, start_workers, wait_workers_online


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a small run (CI smoke test)")
    args = ap.parse_args()
    if args.quick:
        args.jobs = 600
    side = int(args.jobs ** 0.5) + 1
    with tempfile.TemporaryDirectory() as tmp, scratch_cluster(FARM_NOOP_JOBS="1", FARM_JOB_LIMIT="100000",
                                                                FARM_HEARTBEAT_S="1") as env:
        from sqlalchemy import func, select

        from farm.db.models import Job, Result
        from farm.db.session import session_scope
        from scheduler.enqueue import submit
        from schemas import ProfileRequest
        from schemas.job import FINAL, JobStatus

        model = example_model(Path(tmp))
        workers = start_workers(args.workers, env, Path(tmp))
        try:
            wait_workers_online(args.workers)
            time.sleep(2.0)  # the Celery consumers subscribe just after registration
            batches = list(range(1, side + 1))
            conc = list(range(1, args.jobs // side + 1))
            t0 = time.perf_counter()
            sub = submit(ProfileRequest(model=str(model), batch_sizes=batches, concurrency=conc))
            t_sub = time.perf_counter() - t0
            n = len(sub.expansion.jobs)
            done = 0
            while True:
                with session_scope() as s:
                    done = s.scalar(select(func.count()).select_from(Job).where(
                        Job.status.in_(list(FINAL))))
                if done >= n:
                    break
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError(f"only {done}/{n} jobs done after 600 s")
                time.sleep(0.05)
            elapsed = time.perf_counter() - t0
            with session_scope() as s:
                results = s.scalar(select(func.count()).select_from(Result))
                ok = s.scalar(select(func.count()).select_from(Job).where(Job.status == JobStatus.succeeded))
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(timeout=60)
    print(f"dispatch: {n} no-op jobs, {args.workers} worker processes: submit {t_sub:.2f} s, all final after "
          f"{elapsed:.2f} s -> {n / elapsed:.0f} jobs/s end to end ({ok} succeeded, {results} result rows)")


if __name__ == "__main__":
    main()

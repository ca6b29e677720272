"""`farm results` with 1,000,000 result rows in the database (1,000 requests x 1,000 jobs, loaded by COPY).

Target: < 1 s for `farm results REQUEST` (one request's 1,000 rows out of 1,000,000) thanks to the
indexes on jobs(request_id, status), results(job_id) and requests(created_at). Also times `farm status`
(job counts, recent requests) and, for information, one whole-table aggregation in SQL.

    python benchmarks/scale_results.py [--quick] [--requests 1000] [--jobs-per-request 1000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

from _scale_common import scratch_cluster

ENGINES = ("onnxruntime", "triton", "torchscript")


def _load(url: str, n_requests: int, per_request: int) -> list[str]:
    """COPY synthetic requests, jobs and results; returns the request ids."""
    from sqlalchemy import create_engine

    engine = create_engine(url)
    rng = random.Random(7)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    sha = "c" * 64
    rids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(n_requests)]
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        # the model's row only (its bytes live in the model store since migration 0012; these jobs never fetch them)
        cur.execute("INSERT INTO model_artifacts (sha256, filename, format, size_bytes, location, layout, inputs, "
                    "created_at) VALUES (%s, 'm.onnx', 'onnx', 1, %s, 'file', '[]', now())", (sha, f"sha256/{sha}"))
        buf = io.StringIO()
        for i, rid in enumerate(rids):
            buf.write(f"{rid}\tbench-{i}\t{sha}\t{{}}\t[]\t{(t0 + timedelta(minutes=i)).isoformat()}\n")
        buf.seek(0)
        cur.copy_expert("COPY requests (id, name, model_sha256, spec, excluded, created_at) FROM STDIN", buf)
        for chunk in range(0, n_requests, 100):
            jobs, results = io.StringIO(), io.StringIO()
            for rid in rids[chunk:chunk + 100]:
                for k in range(per_request):
                    jid = uuid.uuid4().hex
                    eng, b, c = ENGINES[k % 3], 1 + (k // 3) % 64, 1 + k % 8
                    jobs.write(f"{jid}\t{rid}\tcpu\t{eng}\t{b}\t{c}\tfarm.cpu\t{{}}\tsucceeded\t1\tw1\t"
                               f"{t0.isoformat()}\n")
                    thr = rng.uniform(10, 5000)
                    p50 = rng.uniform(0.5, 50)
                    results.write(f"{jid}\t{rid}\tw1\t{{}}\t{t0.isoformat()}\t{thr:.3f}\t{p50:.3f}\t{p50 * 1.5:.3f}\t"
                                  f"{p50 * 2:.3f}\ttrue\n")
            jobs.seek(0)
            results.seek(0)
            cur.copy_expert("COPY jobs (id, request_id, device, engine, batch_size, concurrency, queue, spec, "
                            "status, attempts, worker_id, created_at) FROM STDIN", jobs)
            cur.copy_expert("COPY results (job_id, request_id, worker_id, details, created_at, "
                            "throughput_infer_per_s, latency_p50_ms, latency_p95_ms, latency_p99_ms, stable) "
                            "FROM STDIN", results)
        raw.commit()
        cur.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()
        engine.dispose()
    return rids


def _time(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm (connection, statement cache)
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--jobs-per-request", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a small run (CI smoke test)")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.repeat = 100, 3
    with scratch_cluster() as env:
        from sqlalchemy import text

        from farm.cli import views
        from farm.db.session import get_engine
        from farm.readers.results import recent_requests, result_rows, status_counts

        t = time.perf_counter()
        rids = _load(env["FARM_DATABASE_URL"], args.requests, args.jobs_per_request)
        load_s = time.perf_counter() - t
        with get_engine().connect() as conn:
            n = conn.execute(text("SELECT count(*) FROM results")).scalar()
        rid = rids[len(rids) // 2]
        rows_s = _time(lambda: result_rows(rid), args.repeat)
        json_s = _time(lambda: views.to_json(result_rows(rid)), args.repeat)
        prefix_s = _time(lambda: result_rows(rid[:8]), args.repeat)
        counts_s = _time(lambda: status_counts(rid), args.repeat)
        recent_s = _time(lambda: recent_requests(), args.repeat)

        def whole_table() -> None:
            with get_engine().connect() as conn:
                conn.execute(text("SELECT j.engine, j.batch_size, count(*), avg(r.throughput_infer_per_s), "
                                  "max(r.latency_p99_ms) FROM results r JOIN jobs j ON j.id = r.job_id "
                                  "GROUP BY j.engine, j.batch_size")).all()

        agg_s = _time(whole_table, max(1, args.repeat // 2))
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "farm", "results", rid, "--format", "json"], capture_output=True,
                              text=True, env={**__import__("os").environ, **env}, timeout=120)
        cli_s = time.perf_counter() - t
        assert proc.returncode == 0, proc.stderr
        assert len(json.loads(proc.stdout)) == args.jobs_per_request
    print(f"results: {n:,} result rows loaded in {load_s:.1f} s. Median of {args.repeat}: "
          f"farm results query (1 request, {args.jobs_per_request} rows) {rows_s * 1000:.0f} ms, "
          f"+ JSON rendering {json_s * 1000:.0f} ms, by id prefix {prefix_s * 1000:.0f} ms; "
          f"status counts {counts_s * 1000:.1f} ms; recent requests {recent_s * 1000:.1f} ms; "
          f"whole-table GROUP BY over all rows {agg_s * 1000:.0f} ms; "
          f"`farm results --format json` subprocess incl. interpreter start {cli_s:.2f} s")


if __name__ == "__main__":
    main()

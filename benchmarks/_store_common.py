"""What ``store_submit.py`` and ``store_fetch.py`` share (issue 38, point 3): a model file of random bytes, the
store under test (a local folder, or a real SeaweedFS started as ``tests/seaweedfs.py`` starts it), a child
process's seconds and peak RSS above its baseline, the ``cp`` + ``sha256sum`` yardstick, and the interleaved rounds
with medians, spread and per-round ratios."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHUNK = 4 << 20
#: the bucket (and prefix) the benchmarks use on their own SeaweedFS
BUCKET = "farm-bench/models"


def arguments(doc: str, child_args: int) -> argparse.Namespace:
    """The benchmarks' command line: ``--quick`` (200 MiB, 1 round), ``--rounds``, ``--mib``, ``--store``,
    ``--dir`` and the child's hidden ``--child`` (``child_args`` values); ``mib``, ``rounds`` and ``kinds`` set."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="200 MiB, 1 round (a smoke run)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mib", type=int, default=2048, help="the model's size, MiB")
    p.add_argument("--store", choices=["local", "s3", "both"], default="both", help="s3: a SeaweedFS started here")
    p.add_argument("--dir", type=Path, default=None, help="where the model, store and copies go (default: temp)")
    p.add_argument("--child", nargs=child_args, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.mib, args.rounds = (200, 1) if args.quick else (args.mib, args.rounds)
    args.kinds = ["local", "s3"] if args.store == "both" else [args.store]
    args.synced = not args.quick  # the cp + sync + sha256sum yardstick: full runs only (--quick stays < 60 s)
    return args


def make_model(path: Path, mib: int) -> str:
    """Write ``mib`` MiB of random bytes (every block written: no sparse file) to ``path``; their sha256."""
    sha = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(mib * (1 << 20) // CHUNK):
            chunk = os.urandom(CHUNK)
            sha.update(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return sha.hexdigest()


@contextmanager
def store_env(kind: str, tmp: Path) -> Iterator[dict[str, str]]:
    """The FARM_* settings of a model store of ``kind`` (``local``: a folder under ``tmp``; ``s3``: a real
    SeaweedFS with its data under ``tmp``, stopped at the block's end), for the child processes."""
    home = tmp / f"home-{kind}"
    home.mkdir()
    if kind == "local":
        yield {"FARM_HOME": str(home), "FARM_STORE_URL": str(tmp / "store")}
        return
    from tests.seaweedfs import seaweedfs_server  # noqa: PLC0415 - pytest and httpx: the s3 runs only

    data = tmp / "seaweedfs"
    data.mkdir()
    with seaweedfs_server(data) as server:
        yield {"FARM_HOME": str(home), **server.env(BUCKET)}


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory figure, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measured(fn: Callable[[], None]) -> None:
    """Run ``fn`` in this (child) process and print its seconds and peak RSS above the baseline it had before it
    (``/proc/self/clear_refs`` restarts the peak, ``VmHWM``) as one JSON line."""
    Path("/proc/self/clear_refs").write_text("5")
    baseline = _status("VmRSS")
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    print(json.dumps({"s": seconds, "peak_mb": (_status("VmHWM") - baseline) / 1e6}))


def child(script: str, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(seconds, peak RSS above baseline, MB) that ``script --child ARGS`` (a fresh process) printed."""
    out = subprocess.run([sys.executable, script, "--child", *args], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env}).stdout
    figures = json.loads(out.splitlines()[-1])
    return float(figures["s"]), float(figures["peak_mb"])


def yardstick(src: Path, scratch: Path, sync: bool) -> float:
    """Seconds of ``cp`` of ``src`` to a fresh file (then ``sync`` of it, if asked), then ``sha256sum`` of it."""
    copy = scratch / "copy"
    started = time.perf_counter()
    try:
        subprocess.run(["cp", str(src), str(copy)], check=True)
        if sync:
            subprocess.run(["sync", str(copy)], check=True)
        subprocess.run(["sha256sum", str(copy)], check=True, capture_output=True)
        return time.perf_counter() - started
    finally:
        copy.unlink(missing_ok=True)


def spread(values: list[float], fmt: str) -> str:
    """The median, with (min-max)."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def s3_yardstick(env: dict[str, str], src: Path, way: str) -> Callable[[], float]:
    """Seconds of boto3's own threaded transfer of ``src`` to (``way`` "up": ``upload_file``) or from ("down":
    ``download_file``) the SeaweedFS ``env`` names, no hashing: the store's own speed on this host."""
    import boto3  # noqa: PLC0415 - the s3 runs only

    client = boto3.session.Session().client(
        "s3", endpoint_url=env["FARM_S3_ENDPOINT"], region_name=env["FARM_S3_REGION"],
        aws_access_key_id=env["FARM_S3_ACCESS_KEY_ID"], aws_secret_access_key=env["FARM_S3_SECRET_ACCESS_KEY"])
    bucket = BUCKET.split("/")[0]
    try:
        client.head_bucket(Bucket=bucket)
    except client.exceptions.ClientError:  # not there yet (the submit benchmark's yardstick may run first)
        client.create_bucket(Bucket=bucket)
    if way == "down":
        client.upload_file(str(src), bucket, "yardstick")

    def run() -> float:
        started = time.perf_counter()
        if way == "up":
            client.upload_file(str(src), bucket, "yardstick")
        else:
            client.download_file(bucket, "yardstick", str(src.with_name("downloaded")))
            src.with_name("downloaded").unlink()
        return time.perf_counter() - started

    return run


def interleaved(what: str, rounds: int, run: Callable[[], tuple[float, float]], src: Path, scratch: Path,
                mib: int, store: Callable[[], float] | None = None, synced: bool = True) -> dict[str, float]:
    """``rounds`` rounds of ``run`` (seconds, peak MB), of the yardsticks on ``src`` and of ``store`` (the store's
    own transfer, seconds), in alternating order (A, B, C; C, B, A); prints each round, then medians with
    (min-max) and the per-round ratios; returns the medians (for a summary)."""
    got: dict[str, list[float]] = {"s": [], "peak": [], "plain": [], "synced": [], "store": []}
    steps = ["run", "plain"] + (["synced"] if synced else []) + (["store"] if store is not None else [])
    for r in range(rounds):
        for step in steps if r % 2 == 0 else steps[::-1]:
            if step == "run":
                s, peak = run()
                got["s"].append(s)
                got["peak"].append(peak)
            elif step == "store" and store is not None:
                got["store"].append(store())
            else:
                got[step].append(yardstick(src, scratch, step == "synced"))
        sync = f", cp+sync+sha256sum {got['synced'][-1]:.2f} s" if synced else ""
        own = f", the store's own transfer {got['store'][-1]:.2f} s" if store is not None else ""
        print(f"  round {r + 1}: {what} {got['s'][-1]:.2f} s (peak +{got['peak'][-1]:.1f} MB), cp+sha256sum "
              f"{got['plain'][-1]:.2f} s{sync}{own}", flush=True)
    return _report(what, got, mib)


def _report(what: str, got: dict[str, list[float]], mib: int) -> dict[str, float]:
    ratios = {k: [f / y for f, y in zip(got["s"], got[k], strict=True)] for k in ("plain", "synced", "store")
              if got[k]}
    print(f"  {what}: {spread(got['s'], '.2f')} s, {mib / statistics.median(got['s']):.0f} MiB/s")
    print(f"  peak RSS above baseline: {spread(got['peak'], '.1f')} MB (target < 300)")
    print(f"  cp + sha256sum:          {spread(got['plain'], '.2f')} s")
    if got["synced"]:
        print(f"  cp + sync + sha256sum:   {spread(got['synced'], '.2f')} s")
    if got["store"]:
        print(f"  the store's own transfer (boto3, threads, no hashing): {spread(got['store'], '.2f')} s")
    print(f"  {what} / (cp + sha256sum):        {spread(ratios['plain'], '.2f')} (target <= 1.5)")
    if "synced" in ratios:
        print(f"  {what} / (cp + sync + sha256sum): {spread(ratios['synced'], '.2f')}")
    if "store" in ratios:
        print(f"  {what} / the store's own transfer: {spread(ratios['store'], '.2f')}")
    print("", flush=True)
    return {"s": statistics.median(got["s"]), "peak_mb": statistics.median(got["peak"]),
            **{f"ratio_{k}": statistics.median(v) for k, v in ratios.items()}}

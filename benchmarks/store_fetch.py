"""How much memory and time does a worker's fetch of a real-size model into its cache cost (issue 38, point 3)?

Method: a model of random bytes (2 GiB; ``--quick``: 200 MiB) is put in a directory-backed model store (a blob
named by its sha256, as ``farm.store.backends``'s local store keeps them); each round, a fresh child process
fetches it into an empty cache with ``farm.store.cache.ModelCache.use`` (streamed, sha256 checked while
streaming, fsynced, renamed, marked) and reports the seconds ``use`` took and its peak RSS above the baseline it
had after its imports (``/proc/self/clear_refs`` resets the peak, then ``VmHWM``). The yardstick, in the same
round, in alternating order: ``cp`` of the blob to a fresh file then ``sha256sum`` of the copy (the issue's), and
the same with ``sync`` of the copy before hashing (the cache fsyncs what it publishes). Both read a blob the page
cache holds. Printed: medians over the rounds with (min-max), and the median per-round ratio fetch / yardstick.

Targets: peak RSS above baseline < 300 MB; fetch <= 1.5x ``cp`` + ``sha256sum``.

Run: ``python benchmarks/store_fetch.py [--quick] [--rounds 5] [--mib 2048] [--dir DIR]``. Prints figures,
asserts nothing.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHUNK = 4 << 20


class BlobDir:
    """The smallest directory-backed ``BlobStore`` a fetch needs: blobs as files named by their sha256."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"

    def put(self, digest: str, src: BinaryIO, size: int) -> None:
        raise NotImplementedError("the benchmark writes its blob itself")

    @contextmanager
    def get(self, digest: str) -> Iterator[BinaryIO]:
        with open(self.root / digest, "rb") as f:
            yield f

    def exists(self, digest: str) -> bool:
        return (self.root / digest).is_file()

    def size(self, digest: str) -> int | None:
        path = self.root / digest
        return path.stat().st_size if path.is_file() else None


def make_blob(store: Path, mib: int) -> str:
    """Write ``mib`` MiB of random bytes into the store as one blob; its sha256."""
    tmp = store / "blob.tmp"
    sha = hashlib.sha256()
    with open(tmp, "wb") as f:
        for _ in range(mib * (1 << 20) // CHUNK):
            chunk = os.urandom(CHUNK)
            sha.update(chunk)
            f.write(chunk)
    digest = sha.hexdigest()
    tmp.rename(store / digest)
    return digest


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory figure, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(store: Path, cache: Path, digest: str) -> None:
    """One fetch into an empty cache, in this process: prints seconds and peak RSS above baseline as JSON."""
    from farm.store.cache import ModelCache

    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS (VmHWM) restarts from the current RSS
    baseline = _status("VmRSS")
    started = time.perf_counter()
    with ModelCache(cache, BlobDir(store), None).use(digest, "model.gguf", "file") as path:
        seconds = time.perf_counter() - started
        assert path.stat().st_size == (store / digest).stat().st_size
    print(json.dumps({"s": seconds, "peak_mb": (_status("VmHWM") - baseline) / 1e6}))


def fetch_round(store: Path, scratch: Path, digest: str) -> tuple[float, float]:
    """(seconds, peak RSS above baseline, MB) of one fetch by a fresh process into an empty cache."""
    cache = scratch / "cache"
    try:
        out = subprocess.run([sys.executable, __file__, "--child", str(store), str(cache), digest],
                             check=True, capture_output=True, text=True).stdout
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    figures = json.loads(out.splitlines()[-1])
    return float(figures["s"]), float(figures["peak_mb"])


def yardstick_round(blob: Path, scratch: Path, sync: bool) -> float:
    """Seconds of ``cp`` of the blob to a fresh file (then ``sync`` of it, if asked), then ``sha256sum`` of it."""
    copy = scratch / "copy"
    started = time.perf_counter()
    try:
        subprocess.run(["cp", str(blob), str(copy)], check=True)
        if sync:
            subprocess.run(["sync", str(copy)], check=True)
        subprocess.run(["sha256sum", str(copy)], check=True, capture_output=True)
        return time.perf_counter() - started
    finally:
        copy.unlink(missing_ok=True)


def spread(values: list[float], fmt: str) -> str:
    """The median, with (min-max)."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="200 MiB, 2 rounds (a smoke run)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mib", type=int, default=2048, help="the model's size, MiB")
    p.add_argument("--dir", type=Path, default=None, help="where the store and cache go (default: the temp dir)")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.child[2])
        return 0
    mib, rounds = (200, 2) if args.quick else (args.mib, args.rounds)
    with tempfile.TemporaryDirectory(prefix="farm-store-fetch-", dir=args.dir) as tmp:
        store, scratch = Path(tmp) / "store", Path(tmp) / "scratch"
        store.mkdir()
        scratch.mkdir()
        digest = make_blob(store, mib)
        print(f"model: {mib} MiB of random bytes, sha256 {digest[:12]}, {rounds} rounds, in {tmp}")
        fetch_s: list[float] = []
        peaks: list[float] = []
        plain: list[float] = []
        synced: list[float] = []
        for r in range(rounds):
            order = ["fetch", "plain", "synced"] if r % 2 == 0 else ["synced", "plain", "fetch"]
            for what in order:
                if what == "fetch":
                    s, peak = fetch_round(store, scratch, digest)
                    fetch_s.append(s)
                    peaks.append(peak)
                else:
                    (plain if what == "plain" else synced).append(
                        yardstick_round(store / digest, scratch, what == "synced"))
            print(f"  round {r + 1}: fetch {fetch_s[-1]:.2f} s (peak +{peaks[-1]:.1f} MB), cp+sha256sum "
                  f"{plain[-1]:.2f} s, cp+sync+sha256sum {synced[-1]:.2f} s", flush=True)
    print(f"fetch into the cache:     {spread(fetch_s, '.2f')} s, {mib / statistics.median(fetch_s):.0f} MiB/s")
    print(f"peak RSS above baseline:  {spread(peaks, '.1f')} MB (target < 300)")
    print(f"cp + sha256sum:           {spread(plain, '.2f')} s")
    print(f"cp + sync + sha256sum:    {spread(synced, '.2f')} s")
    vs_plain = [f / y for f, y in zip(fetch_s, plain, strict=True)]
    vs_synced = [f / y for f, y in zip(fetch_s, synced, strict=True)]
    print(f"fetch / (cp + sha256sum):        {spread(vs_plain, '.2f')} (target <= 1.5)")
    print(f"fetch / (cp + sync + sha256sum): {spread(vs_synced, '.2f')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

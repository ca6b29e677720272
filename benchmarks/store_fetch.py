"""How much memory and time does a worker's fetch of a real-size model into its cache cost (issue 38, point 3)?

Method: a model of random bytes (2 GiB, every block written; ``--quick``: 200 MiB) is put in the model store as one
blob; each round, a fresh child process fetches it into an empty cache with ``farm.store.cache.ModelCache.use``
(streamed, sha256 checked while streaming, fsynced, renamed, marked) and reports the seconds ``use`` took and its
peak RSS above the baseline it had after its imports (``/proc/self/clear_refs`` resets the peak, then ``VmHWM``).
Stores: the local folder (``farm.store.backends.LocalStore``, the embedded default) and a real SeaweedFS (``weed
server``, started as ``tests/seaweedfs.py`` starts it, on this host; ``S3Store``). The yardstick, in the same round,
in alternating order: ``cp`` of the model file to a fresh file then ``sha256sum`` of the copy (the issue's), and the
same with ``sync`` of the copy before hashing (the cache fsyncs what it publishes; full runs only), and on SeaweedFS
boto3's own threaded ``download_file`` of the blob (no hashing: the store's own speed on this host). They read a
file the page cache holds. Printed per store: medians over the rounds with (min-max), and the median per-round ratio
fetch / yardstick.

Targets: peak RSS above baseline < 300 MB; fetch <= 1.5x ``cp`` + ``sha256sum``.

Run: ``python benchmarks/store_fetch.py [--quick] [--rounds 5] [--mib 2048] [--store local|s3|both] [--dir DIR]``.
Prints figures, asserts nothing.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from _store_common import arguments, child, interleaved, make_model, measured, s3_yardstick, store_env  # noqa: I001 - beside this file


def fetch_child(cache: Path, digest: str) -> None:
    """One fetch into an empty cache from the store the environment names, in this process (figures as JSON)."""
    from farm.settings import get_settings
    from farm.store.backends import open_store
    from farm.store.cache import ModelCache

    if (get_settings().store_url or "").startswith("s3://"):
        import farm.store.s3  # noqa: F401 - boto3 loaded before the baseline, as any S3 worker has it
    store = open_store()

    def run() -> None:
        with ModelCache(cache, store, None).use(digest, "model.gguf", "file") as path:
            assert path.stat().st_size == store.size(digest)

    measured(run)


def put_blob(env: dict[str, str], model: Path, digest: str) -> None:
    """Put ``model`` in the store as blob ``digest`` (a hard link into a local store: no copy)."""
    from farm.settings import Settings
    from farm.store.backends import LocalStore, open_store

    store = open_store(Settings(**{k[5:].lower(): v for k, v in env.items()}))
    if isinstance(store, LocalStore):
        store.path(digest).parent.mkdir(parents=True, exist_ok=True)
        os.link(model, store.path(digest))
        return
    with model.open("rb") as f:
        store.put(digest, f, model.stat().st_size)


def main() -> int:
    args = arguments(__doc__, 2)
    if args.child:
        fetch_child(Path(args.child[0]), args.child[1])
        return 0
    mib, rounds, kinds = args.mib, args.rounds, args.kinds
    with tempfile.TemporaryDirectory(prefix="farm-store-fetch-", dir=args.dir) as tmp:
        model, scratch, cache = Path(tmp) / "model.gguf", Path(tmp) / "scratch", Path(tmp) / "cache"
        scratch.mkdir()
        digest = make_model(model, mib)
        print(f"model: {mib} MiB of random bytes, sha256 {digest[:12]}, {rounds} rounds, in {tmp}")
        for kind in kinds:
            with store_env(kind, Path(tmp)) as env:
                put_blob(env, model, digest)
                print(f"fetch from the {kind} store ({env['FARM_STORE_URL']}) into an empty cache:", flush=True)

                def run(env: dict[str, str] = env) -> tuple[float, float]:
                    try:
                        return child(__file__, [str(cache), digest], env)
                    finally:
                        shutil.rmtree(cache, ignore_errors=True)

                own = s3_yardstick(env, model, "down") if kind == "s3" else None
                interleaved("fetch", rounds, run, model, scratch, mib, own, args.synced)
    return 0


if __name__ == "__main__":
    sys.exit(main())

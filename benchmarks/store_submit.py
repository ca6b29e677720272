"""How much memory and time does ``farm submit`` of a real-size model into the model store cost (issue 38,
point 3)?

Method: a model file of random bytes (2 GiB, every block written; ``--quick``: 200 MiB) is taken into the store each
round by a fresh child process, the way ``scheduler.enqueue.submit`` takes a model in: ``farm.artifacts .take_in``
stages the file while the inspection's ``sha256_file`` hashes it (local: one read, written under a temporary name
as it is hashed, fsynced, then renamed to the digest's name; S3: the file hashed first, then read again into a
multipart upload to the digest's key, completed at publish), then publishes it as ``store_model`` does. The child
reports the seconds that took and its peak RSS above the baseline it had after its imports
(``/proc/self/clear_refs`` resets the peak, then ``VmHWM``); the blob is checked and removed after each round (each
round stores it anew). The yardstick, in the same round, in alternating order: ``cp`` of the model to a fresh file
then ``sha256sum`` of the copy (the issue's), and the same with ``sync`` of the copy before hashing (the local store
fsyncs what it publishes; full runs only), and on SeaweedFS boto3's own threaded ``upload_file`` of the model (no
hashing: the store's own speed on this host). Stores: the local folder (the embedded default) and a real SeaweedFS
(``weed server``, started as ``tests/seaweedfs.py`` starts it, on this host). Printed per store: medians over the
rounds with (min-max), and the median per-round ratio submit / yardstick.

Targets: peak RSS above baseline < 300 MB; submit <= 1.5x ``cp`` + ``sha256sum``.

Run: ``python benchmarks/store_submit.py [--quick] [--rounds 5] [--mib 2048] [--store local|s3|both] [--dir DIR]``.
Prints figures, asserts nothing.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _store_common import arguments, child, interleaved, make_model, measured, s3_yardstick, store_env  # noqa: I001 - beside this file


def submit_child(model: Path) -> None:
    """One submit's intake of ``model`` into the store the environment names, in this process (figures as JSON)."""
    from farm.artifacts import take_in
    from farm.models.spec import sha256_file
    from farm.settings import get_settings

    if (get_settings().store_url or "").startswith("s3://"):
        import farm.store.s3  # noqa: F401 - boto3 loaded before the baseline, as any S3 submit has it

    def run() -> None:
        with take_in() as intake, intake.hashing():
            digest = sha256_file(model)
            staged = intake.staged(model, digest)
            assert staged is not None and staged.size == model.stat().st_size
            staged.publish()

    measured(run)


def published_then_removed(env: dict[str, str], digest: str, size: int) -> None:
    """Check blob ``digest`` is in the store with ``size`` bytes, then remove it (the next round stores it anew)."""
    from farm.settings import Settings
    from farm.store.backends import LocalStore, open_store

    store = open_store(Settings(**{k[5:].lower(): v for k, v in env.items()}))
    if store.size(digest) != size:
        raise RuntimeError(f"the submit did not publish {digest[:12]} ({size} bytes) in {store.url}")
    if isinstance(store, LocalStore):
        store.path(digest).unlink()
    else:
        s3 = store.client  # type: ignore[attr-defined]
        s3.delete_object(Bucket=store.bucket, Key=store.key(digest))  # type: ignore[attr-defined]


def main() -> int:
    args = arguments(__doc__, 1)
    if args.child:
        submit_child(Path(args.child[0]))
        return 0
    mib, rounds, kinds = args.mib, args.rounds, args.kinds
    with tempfile.TemporaryDirectory(prefix="farm-store-submit-", dir=args.dir) as tmp:
        model, scratch = Path(tmp) / "model.gguf", Path(tmp) / "scratch"
        scratch.mkdir()
        digest = make_model(model, mib)
        print(f"model: {mib} MiB of random bytes, sha256 {digest[:12]}, {rounds} rounds, in {tmp}")
        for kind in kinds:
            with store_env(kind, Path(tmp)) as env:
                print(f"submit into the {kind} store ({env['FARM_STORE_URL']}):", flush=True)

                def run(env: dict[str, str] = env) -> tuple[float, float]:
                    figures = child(__file__, [str(model)], env)
                    published_then_removed(env, digest, model.stat().st_size)
                    return figures

                own = s3_yardstick(env, model, "up") if kind == "s3" else None
                interleaved("submit", rounds, run, model, scratch, mib, own, args.synced)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``argus sync SRC DST``: copy a store to or from object storage (``s3://bucket/prefix``)."""

from __future__ import annotations

import argparse
import signal
import threading

from argus.cli.defaults import config_default
from argus.cli.progress import stderr_console
from argus.text import term

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    from argus.evidence.retention import RetentionPolicy

    p = sub.add_parser("sync", help="copy a store to/from object storage (s3://bucket/prefix)",
                       description="Upload the files a bucket lacks (SRC a store directory, DST s3://...), or "
                                   "download them (SRC s3://..., DST a directory). Files are immutable, so this "
                                   "is append-only and safe to repeat; evidence traces in the bucket are kept "
                                   "within the retention budget, each host directory of the store a budget of its "
                                   "own (other stores' hosts in the bucket are left alone). A push lists only the "
                                   "bucket directories the store has; --watch lists none after its first push (it "
                                   "records what it pushed in SRC/.argus-mirror/, or --state-dir). S3 endpoint: ?endpoint=URL or "
                                   "AWS_ENDPOINT_URL.")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--watch", action="store_true", help="keep pushing every --interval seconds until interrupted")
    p.add_argument("--interval", type=float, default=30.0)
    p.add_argument("--evidence-max-mb", type=float, default=config_default(RetentionPolicy, "max_bytes") / (1 << 20),
                   help="evidence kept in the bucket per host (0: no limit)")
    p.add_argument("--evidence-max-age-h", type=float, default=config_default(RetentionPolicy, "max_age_s") / 3600,
                   help="evidence age limit (0: no limit)")
    p.add_argument("--state-dir", help="with --watch: where the mirror keeps its ledger (default SRC/.argus-mirror); "
                                       "a writable directory when SRC is mounted read-only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.errors import ConfigError
    from argus.objstore import Mirror, enforce_remote_retention, evidence_prefixes, open_objstore, pull, push

    console = stderr_console()
    remote_src, remote_dst = args.src.startswith("s3://"), args.dst.startswith("s3://")
    if remote_src == remote_dst:
        raise ConfigError("exactly one of SRC and DST must be s3://bucket/prefix")
    max_bytes = int(args.evidence_max_mb * (1 << 20)) or None
    max_age = args.evidence_max_age_h * 3600.0 or None
    if remote_src:
        if args.watch:
            raise ConfigError("--watch pushes a live store: use it with a local SRC")
        s = pull(open_objstore(args.src), args.dst)
        console.print(f"pulled {s.copied} file(s), {s.bytes / 1e6:.1f} MB ({s.skipped} already here)")
        return 0
    remote = open_objstore(args.dst, create_bucket=True)
    if not args.watch:
        s = push(args.src, remote)
        gone = enforce_remote_retention(remote, max_bytes=max_bytes, max_age_s=max_age,
                                        prefixes=evidence_prefixes(args.src))  # each host of SRC its own budget
        console.print(f"pushed {s.copied} file(s), {s.bytes / 1e6:.1f} MB ({s.skipped} already there); "
                      f"{len(gone)} old evidence file(s) removed")
        return 0
    mirror = Mirror(args.src, remote, args.interval, max_bytes, max_age, state_dir=args.state_dir).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    console.print(f"mirroring {term(args.src)} → {term(args.dst)} every {args.interval:g} s (Ctrl-C to stop)")
    stop.wait()
    mirror.stop()
    console.print(f"pushed {mirror.stats.copied} file(s), {mirror.stats.bytes / 1e6:.1f} MB in all")
    return 0

"""``argus serve S``: the web UI over a store (127.0.0.1 by default; a token for anything else)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="web UI: runs, step time, incidents with plots, evidence downloads (live)",
                       description="Serve a live, read-only web UI over a store. Pages refresh themselves when new "
                                   "windows or incidents arrive. Binds 127.0.0.1 unless --host is given; any other "
                                   "address needs --token (or ARGUS_SERVE_TOKEN) or --insecure.")
    p.add_argument("store", help="store directory; or s3://bucket/prefix (pulled into a local cache and kept up to "
                                 "date); or prom://HOST:PORT?job=J[&run=R] (a snapshot read from the TSDB at start)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0: any free port)")
    p.add_argument("--token", help="require this token on every request (Authorization: Bearer T, or ?token=T once "
                                   "in a browser); default: $ARGUS_SERVE_TOKEN")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without a token")
    p.add_argument("--poll", type=float, default=3.0, help="seconds between a page's checks for new data (default 3)")
    p.add_argument("--verbose", action="store_true", help="log every request on stderr")
    p.set_defaults(func=run)


def _local_store(source: str, every_s: float):
    """A directory to serve for ``source``, and a thread that keeps it current (or None)."""
    import threading

    if source.startswith("s3://"):
        from argus.objstore import local_copy, open_objstore, pull

        path = local_copy(source)
        remote, stop = open_objstore(source), threading.Event()

        def follow() -> None:  # the store is append-only: pulling is copying new files
            while not stop.wait(every_s):
                try:
                    pull(remote, path)
                except Exception as exc:  # noqa: BLE001 - an unreachable bucket must not end the UI
                    print(f"argus serve: pulling {source} failed (will retry): {exc}", file=sys.stderr)

        threading.Thread(target=follow, name="argus-serve-pull", daemon=True).start()
        return str(path), stop
    from argus.tsdb.promql import is_prom_url
    from argus.tsdb.readback import open_attempt

    if is_prom_url(source):
        attempt = open_attempt(source)  # materialised into a temporary store, removed at exit
        return str(attempt.path.parents[2]), None
    return source, None


def run(args: argparse.Namespace) -> int:
    from argus.serve import ServeConfig, serve

    args.store, _ = _local_store(args.store, max(args.poll * 5, 10.0))
    config = ServeConfig.from_env(store=args.store, host=args.host, port=args.port, token=args.token,
                                  insecure=args.insecure, poll_s=args.poll, quiet=not args.verbose)

    def ready(server) -> None:
        auth = " (token required)" if config.token else (" (NO authentication)" if config.insecure else "")
        print(f"argus serve: {config.store} at {server.url}{auth}; Ctrl-C to stop", file=sys.stderr, flush=True)

    serve(config, on_ready=ready)
    return 0

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
    p.add_argument("store", help="store directory")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0: any free port)")
    p.add_argument("--token", help="require this token on every request (Authorization: Bearer T, or ?token=T once "
                                   "in a browser); default: $ARGUS_SERVE_TOKEN")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without a token")
    p.add_argument("--poll", type=float, default=3.0, help="seconds between a page's checks for new data (default 3)")
    p.add_argument("--verbose", action="store_true", help="log every request on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.serve import ServeConfig, serve

    config = ServeConfig.from_env(store=args.store, host=args.host, port=args.port, token=args.token,
                                  insecure=args.insecure, poll_s=args.poll, quiet=not args.verbose)

    def ready(server) -> None:
        auth = " (token required)" if config.token else (" (NO authentication)" if config.insecure else "")
        print(f"argus serve: {config.store} at {server.url}{auth}; Ctrl-C to stop", file=sys.stderr, flush=True)

    serve(config, on_ready=ready)
    return 0

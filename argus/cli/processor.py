"""``argus processor --store S``: the per-host daemon."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from argus import env as argus_env
from argus.cli.defaults import config_default

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    from argus.processor import HangConfig, ProcessorConfig
    from argus.tsdb import RemoteWriteConfig

    def default(name: str) -> Any:
        return config_default(ProcessorConfig, name)

    max_pending_mb = default("max_pending_frame_bytes") / (1 << 20)
    remote_queue, remote_backoff, heartbeat = (config_default(RemoteWriteConfig, name)
                                               for name in ("queue_windows", "max_backoff_s", "heartbeat_s"))
    hang_min_s, hang_step_factor = config_default(HangConfig, "min_s"), config_default(HangConfig, "step_factor")
    p = sub.add_parser("processor", help="run the per-host processor daemon",
                       description="Ingest local ranks' batches over a unix socket, window and compress them, "
                                   "and write the store and Perfetto evidence. SIGTERM flushes and exits.")
    p.add_argument("--store", required=True, help="store directory (created if new or empty)")
    p.add_argument("--socket", help="unix socket path (default $ARGUS_SOCKET or /tmp/argus-$UID/processor.sock)")
    p.add_argument("--host", default=default("host"), help="host name for the store partition (default: hostname)")
    p.add_argument("--window-steps", type=int, default=default("window_steps"),
                   help=f"steps per window (default {default('window_steps')})")
    p.add_argument("--window-timeout", type=float, default=default("window_timeout_s"),
                   help="close a window after this many seconds")
    p.add_argument("--max-buffered-events", type=int, default=default("max_buffered_events"),
                   help="memory cap; beyond it batches are dropped")
    p.add_argument("--max-pending-frame-mb", type=float, default=max_pending_mb,
                   help="memory cap on unfinished frames over all connections; the client that passes it is "
                        f"dropped (default {max_pending_mb:g})")
    p.add_argument("--max-connections", type=int, help="connections served at once; more are closed and counted "
                                                       "(default: half of RLIMIT_NOFILE, at most 1024)")
    p.add_argument("--raw-kernels", action="store_true", help="also store raw kernel events (small jobs)")
    p.add_argument("--no-evidence", action="store_true", help="do not write Perfetto evidence files")
    p.add_argument("--evidence-interval", type=float, default=default("evidence_interval_s"),
                   help="seconds between evidence files of normal windows (slow windows always get one; 0: every "
                        "window)")
    p.add_argument("--evidence-max-mb", type=float, default=default("evidence_max_bytes") / (1 << 20),
                   help="evidence retention by size per host")
    p.add_argument("--evidence-max-age-h", type=float, default=default("evidence_max_age_s") / 3600,
                   help="evidence retention by age")
    p.add_argument("--no-fsync", action="store_true", help="skip fsync on commit (tests, tmpfs)")
    p.add_argument("--stack-hz", type=float, default=default("stack_hz"),
                   help=f"py-spy stack samples per second per rank (default {default('stack_hz'):g}: a dump costs "
                        "~8 ms of CPU)")
    p.add_argument("--suspect-stack-hz", type=float, default=default("suspect_stack_hz"),
                   help="stack samples per second for a rank under suspicion: stalled, or a slow last step "
                        f"(default {default('suspect_stack_hz'):g})")
    p.add_argument("--no-stacks", action="store_true", help="do not sample the ranks' stacks with py-spy")
    p.add_argument("--no-host-counters", action="store_true",
                   help="do not sample this host's pressure and port counters (for jobs that do not run on this "
                        "host: a simulator or a replay feeding the processor)")
    p.add_argument("--hw-interval", type=float, default=default("hw_interval_s"),
                   help=f"seconds between NVML GPU telemetry samples (default {default('hw_interval_s'):g}; off "
                        "without NVML)")
    p.add_argument("--remote-write", action="append", default=[], metavar="URL",
                   help="also send each window's series to this Prometheus remote-write endpoint (repeatable), e.g. "
                        "http://127.0.0.1:8428/api/v1/write; see docs/tsdb.md")
    p.add_argument("--remote-write-job", help="job label of the series (default $ARGUS_TSDB_JOB, else 'argus')")
    p.add_argument("--remote-write-queue", type=int, default=remote_queue,
                   help=f"windows waiting per TSDB before the oldest is dropped (default {remote_queue})")
    p.add_argument("--remote-write-max-backoff", type=float, default=remote_backoff,
                   help=f"longest wait between retries of a request, seconds (default {remote_backoff:g})")
    p.add_argument("--remote-write-heartbeat", type=float, default=heartbeat, metavar="S",
                   help="send the processor's liveness series (argus_processor_heartbeat_seconds, its jobs' ranks "
                        "connected and last step) at least every S seconds: the absence alert rules watch them "
                        f"(default {heartbeat:g})")
    p.add_argument("--remote-write-native-histograms", action="store_true",
                   help="also send each kernel's duration sketch as a native histogram (Prometheus needs "
                        "--enable-feature=native-histograms, or it refuses the requests)")
    p.add_argument("--hang-min-s", type=float, default=float(os.environ.get(argus_env.HANG_MIN_S, hang_min_s)),
                   help="live hang detection: never call a stall a hang before this many seconds without progress "
                        f"(default ${argus_env.HANG_MIN_S} or {hang_min_s:g})")
    p.add_argument("--hang-step-factor", type=float,
                   default=float(os.environ.get(argus_env.HANG_STEP_FACTOR, hang_step_factor)),
                   help=f"… nor before this many median step times (default ${argus_env.HANG_STEP_FACTOR} or "
                        f"{hang_step_factor:g})")
    p.add_argument("--mirror", metavar="URI",
                   help="also push the store to object storage (s3://bucket/prefix) every --mirror-interval seconds "
                        "and at exit; this host's evidence there is kept within the same retention, a budget of "
                        "its own (hosts sharing a bucket never delete each other's). What was pushed is recorded "
                        "in STORE/.argus-mirror/, so the bucket is listed only when that ledger is missing")
    p.add_argument("--mirror-interval", type=float, default=60.0, help="seconds between pushes (default 60)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.processor import HangConfig, Processor, ProcessorConfig
    from argus.wire import default_socket_path

    remote = []
    if args.remote_write:
        from argus.tsdb import RemoteWriteConfig

        remote = [RemoteWriteConfig(url=u, job=args.remote_write_job, queue_windows=args.remote_write_queue,
                                    max_backoff_s=args.remote_write_max_backoff,
                                    backoff_s=min(0.1, args.remote_write_max_backoff),
                                    native_histograms=args.remote_write_native_histograms,
                                    heartbeat_s=args.remote_write_heartbeat) for u in args.remote_write]

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s argus-processor %(levelname)s %(message)s")
    config = ProcessorConfig(store=args.store, socket_path=args.socket or default_socket_path(), host=args.host,
                             window_steps=args.window_steps, window_timeout_s=args.window_timeout,
                             max_buffered_events=args.max_buffered_events, raw_kernels=args.raw_kernels,
                             evidence=not args.no_evidence, evidence_max_bytes=int(args.evidence_max_mb * (1 << 20)),
                             evidence_max_age_s=args.evidence_max_age_h * 3600,
                             evidence_interval_s=args.evidence_interval, durable=not args.no_fsync,
                             stacks=not args.no_stacks, host_counters=not args.no_host_counters, stack_hz=args.stack_hz, suspect_stack_hz=args.suspect_stack_hz,
                             hw_interval_s=args.hw_interval, remote_write=remote,
                             hang=HangConfig(min_s=args.hang_min_s, step_factor=args.hang_step_factor),
                             max_pending_frame_bytes=int(args.max_pending_frame_mb * (1 << 20)),
                             **({"max_connections": args.max_connections} if args.max_connections else {}))
    mirror = None
    if args.mirror:  # a thread of its own: an unreachable bucket never slows the processor
        from argus.objstore import Mirror, open_objstore

        mirror = Mirror(args.store, open_objstore(args.mirror, create_bucket=True), args.mirror_interval,
                        int(args.evidence_max_mb * (1 << 20)), args.evidence_max_age_h * 3600,
                        host=args.host).start()  # retention in the bucket: this host's evidence only
    proc = Processor(config)
    proc.install_signal_handlers()
    try:
        proc.serve_forever()
    finally:
        if mirror is not None:
            mirror.stop()  # one last push: what the processor flushed at exit reaches the bucket
    return 0

"""``argus run [--store S] -- CMD...``: trace any training command without changing it.

1. start this host's processor on a fresh socket (or use ``--socket`` of a running one);
2. run CMD with the producer armed in every Python process (``sitecustomize`` on
   ``PYTHONPATH``): it starts in the processes that become ranks — those whose
   ``torch.distributed.init_process_group`` returns — and nowhere else, so CMD can be torchrun,
   ``python -m torch.distributed.run``, a shell script or wrapper ending in one, ``srun`` per
   task, or accelerate/deepspeed-style launchers (a job that never makes a process group is
   traced with ``ARGUS_FORCE=1``);
3. when CMD exits, stop the processor, which writes everything it received, then return
   CMD's exit code. If the processor cannot start (e.g. the store is not writable) the
   error is printed and CMD still runs, untraced. If no rank ever connected, it says so.

Multi-host: run it on every host (``srun argus run --store /shared/S --run-id $SLURM_JOB_ID
-- python train.py``): one processor per host, each writing its own host partition.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from argus import env as argus_env
from argus.cli.defaults import config_default

__all__ = ["register"]

INJECT_DIR = Path(__file__).resolve().parent.parent / "producer" / "_inject"


def register(sub: argparse._SubParsersAction) -> None:
    from argus.processor import HangConfig, ProcessorConfig

    hang_min_s, hang_step_factor = config_default(HangConfig, "min_s"), config_default(HangConfig, "step_factor")
    p = sub.add_parser("run", help="run a training command with tracing injected (zero code change)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default="argus-store", help="store directory (default ./argus-store)")
    p.add_argument("--layout", help="parallel layout, e.g. 'pp=2,dp=2' (default $ARGUS_LAYOUT, else pure DP)")
    p.add_argument("--order", help="rank order (default tp-cp-ep-dp-pp)")
    p.add_argument("--run-id", help="run id of every rank (default: $ARGUS_RUN_ID, Slurm's job id, else one the "
                                    "job's ranks agree on through their rendezvous store)")
    p.add_argument("--host", default=os.environ.get(argus_env.HOST) or socket.gethostname(),
                   help="host name for this host's partition")
    p.add_argument("--socket", help="use the processor already listening on this socket")
    p.add_argument("--window-steps", type=int, default=config_default(ProcessorConfig, "window_steps"))
    p.add_argument("--raw-kernels", action="store_true", help="keep raw kernel/op events too")
    p.add_argument("--kernels", choices=["auto", "cupti", "cpu_ops", "off"], help="kernel channel (default auto)")
    p.add_argument("--no-stacks", action="store_true", help="processor: do not sample stacks")
    p.add_argument("--remote-write", action="append", default=[], metavar="URL",
                   help="processor: also send series to this Prometheus remote-write endpoint (repeatable)")
    p.add_argument("--remote-write-job", help="processor: job label of the series (default 'argus')")
    p.add_argument("--mirror", metavar="URI", help="processor: also push the store to s3://bucket/prefix")
    p.add_argument("--hang-min-s", type=float, help="processor: seconds without progress before a hang is recorded "
                                                     f"(default ${argus_env.HANG_MIN_S} or {hang_min_s:g})")
    p.add_argument("--hang-step-factor", type=float, help="processor: … and at least this many median step times "
                                                           f"(default ${argus_env.HANG_STEP_FACTOR} or "
                                                           f"{hang_step_factor:g})")
    p.add_argument("--no-job-log", action="store_true",
                   help="leave the command's stdout/stderr as they are (default: passed through unchanged while "
                        "known lines — NCCL warnings, timeouts, CUDA errors, OOM, exceptions, killed ranks — are "
                        "kept as events in the store's logs table)")
    p.add_argument("--kernel-log", default="/dev/kmsg", metavar="PATH",
                   help="the host's kernel log, read while the job runs for GPU Xids, the OOM killer and NIC links "
                        "going down (default /dev/kmsg; a text file such as /var/log/kern.log works; 'off': not read)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    p.set_defaults(func=run)


NO_RANK_WARN_S = 300.0  # say so once if the job runs this long without a rank connecting
#: After the job, the processor flushes its open windows and exits. While it flushes it
#: rewrites its status file every 0.5 s with the windows written and left (``daemon._heartbeat``);
#: when those have not moved for this long (or the file is not rewritten: the processor is
#: hung or stopped), it is killed. A window is written in milliseconds; 5 s is many of them.
PROCESSOR_STALL_S = 5.0
#: However much progress it makes, the flush is cut here (a job's last windows, not a backlog).
PROCESSOR_FLUSH_MAX_S = 120.0


def _ranks_seen(store: str, host: str) -> int | None:
    """Ranks that connected to this host's processor, from its status file (None: unknown)."""
    from argus.processor.status import read_status

    status = read_status(store, host)
    try:
        return None if status is None else int(status.ranks_seen)
    except (ValueError, TypeError):
        return None


def _runs_seen(store: str, host: str) -> list[str]:
    """The run ids this host's ranks wrote, from its processor's status file."""
    from argus.processor.status import read_status

    status = read_status(store, host)
    try:
        return sorted({str(key).split("/")[0] for key in status.runs}) if status is not None else []
    except (ValueError, TypeError, AttributeError):
        return []


def _losses(store: str, host: str, runs: list[str]) -> list[str]:
    """What this host's processor lost or could not write, in sentences (empty: nothing):
    windows it failed to write, and the records the store's ``drops`` table counts for it."""
    from argus.processor.status import read_status

    out: list[str] = []
    status = read_status(store, host)
    try:
        errors = int(status.write_errors or 0) if status is not None else 0
    except (ValueError, TypeError):
        errors = 0
    if errors:
        out.append(f"could not write {errors} window(s) into the store (its log says why)")
    try:
        from argus.store import Store

        by_reason: dict[str, int] = {}
        for a in Store.open(store).attempts():
            if a.identity.run_id not in runs or not a.files("drops"):
                continue
            t = a.read("drops", columns=["host", "events", "reason"]).to_pylist()
            for r in t:
                if r["host"] in (host, "", None) and r["events"]:
                    by_reason[str(r["reason"])] = by_reason.get(str(r["reason"]), 0) + int(r["events"])
        if by_reason:
            what = ", ".join(f"{n:,} {reason.replace('_', ' ')}" for reason, n in sorted(by_reason.items()))
            out.append(f"dropped {sum(by_reason.values()):,} record(s) ({what}); the store's drops table has them "
                       "per window and rank")
    except Exception:  # noqa: BLE001 - an unreadable store: the processor's log says more
        pass
    return out


def _flush_progress(store: str, host: str) -> tuple[object, float]:
    """What changes while the stopping processor makes progress, and until when it is busy
    in a bounded wait of its own (wall clock; 0 when none)."""
    from argus.processor.status import read_status

    status = read_status(store, host)
    if status is None:
        return None, 0.0
    stopping = status.stopping
    try:
        return ((status.windows_written, status.write_errors, stopping.windows_left if stopping else None),
                float((stopping.busy_until if stopping else 0.0) or 0.0))
    except (ValueError, TypeError):
        return None, 0.0


def _stop_processor(processor: subprocess.Popen, store: str, host: str, stall_s: float = PROCESSOR_STALL_S,
                    max_s: float = PROCESSOR_FLUSH_MAX_S) -> tuple[int | None, str]:
    """SIGTERM, wait while its flush makes progress, else SIGKILL: ``(exit status, why it was
    killed or "")``."""
    processor.send_signal(signal.SIGTERM)  # it flushes every open window, then exits
    started = last_move = time.monotonic()
    seen, _ = _flush_progress(store, host)
    while processor.poll() is None:
        now = time.monotonic()
        mark, busy_until = _flush_progress(store, host)
        if mark != seen:
            seen, last_move = mark, now
        why = ""
        if now - last_move > stall_s and time.time() > busy_until:
            why = f"it made no progress flushing for {stall_s:.0f} s"
        elif now - started > max_s:
            why = f"it was still flushing {max_s:.0f} s"
        if why:
            processor.kill()
            try:
                return processor.wait(timeout=10), why
            except subprocess.TimeoutExpired:  # unkillable (D state): do not hold the job's exit code
                return None, why
        time.sleep(0.1)
    return processor.returncode, ""


def _exit_text(status: int | None) -> str:
    if status is None:
        return "did not exit even after SIGKILL"
    if status < 0:
        try:
            return f"was ended by {signal.Signals(-status).name}"
        except ValueError:
            return f"was ended by signal {-status}"
    return f"exited with status {status}"


def _open_log(path: Path) -> int:
    """The processor's log in the private runtime directory: never through a planted link
    (``O_NOFOLLOW``), never someone else's file (``O_EXCL`` after removing ours), mode 0600."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _starting(sock: Path, processor: subprocess.Popen, log_path: Path, since: float,
              timeout_s: float = 30.0) -> tuple[bool, subprocess.Popen | None]:
    """``(still starting, the processor or None)`` for a processor starting beside the job: up
    once its socket exists; failed when it exits first or takes ``timeout_s`` (then it is
    killed and the reason printed: the job, already started, runs untraced)."""
    if sock.exists():
        return False, processor
    if processor.poll() is None and time.monotonic() - since < timeout_s:
        return True, processor
    err = log_path.read_text(errors="replace") if processor.poll() is not None else "timed out"
    print(f"argus run: the processor could not start ({err.strip().splitlines()[-1] if err.strip() else '?'}); "
          "the command runs without tracing", file=sys.stderr)
    if processor.poll() is None:
        processor.kill()
        processor.wait()
    return False, None


def run(args: argparse.Namespace) -> int:
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("argus run: no command given (argus run --store S -- torchrun ...)", file=sys.stderr)
        return 2
    # An id given here is every rank's; otherwise each rank proposes this host's name and the
    # job's ranks agree on one through their rendezvous store (producer/activation.py): hosts
    # started seconds apart still write one run.
    given = args.run_id or os.environ.get(argus_env.RUN_ID) or ""
    run_id = given or time.strftime("run-%Y%m%d-%H%M%S")
    processor: subprocess.Popen | None = None
    if args.socket:
        sock = Path(args.socket)
    else:
        from argus.wire import runtime_dir

        sock = runtime_dir() / f"run-{os.getpid()}.sock"
    if not args.socket:
        pargs = [sys.executable, "-m", "argus", "processor", "--store", args.store, "--socket", str(sock),
                 "--host", args.host, "--window-steps", str(args.window_steps)]
        if args.raw_kernels:
            pargs.append("--raw-kernels")
        if args.no_stacks:
            pargs.append("--no-stacks")
        for url in args.remote_write:
            pargs += ["--remote-write", url]
        if args.remote_write_job:
            pargs += ["--remote-write-job", args.remote_write_job]
        if args.mirror:
            pargs += ["--mirror", args.mirror]
        for flag, value in (("--hang-min-s", args.hang_min_s), ("--hang-step-factor", args.hang_step_factor)):
            if value is not None:
                pargs += [flag, str(value)]
        log_path = sock.with_suffix(".log")  # read when it fails; a pipe nobody drains could block it
        log_fd = _open_log(log_path)
        try:
            processor = subprocess.Popen(pargs, stdout=subprocess.DEVNULL, stderr=log_fd, text=True)
        finally:
            os.close(log_fd)
        # The job starts now, not once the processor listens (~0.5 s of its imports): ranks
        # record into their rings from their first event and connect when it is up
        # (producer/transport.py retries), long before a rank's own start-up is over.
        starting_since = time.monotonic()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(INJECT_DIR), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env[argus_env.SOCKET] = str(sock)
    env[argus_env.RUN_ID if given else argus_env.RUN_ID_PROPOSAL] = run_id
    env[argus_env.HOST] = args.host
    for flag, var in ((args.layout, argus_env.LAYOUT), (args.order, argus_env.ORDER), (args.kernels, argus_env.KERNELS)):
        if flag:
            env[var] = flag
    joblog = None
    if not args.no_job_log:
        try:
            from argus.joblog import JobLog, local_rank_offset

            joblog = JobLog(args.store, args.host, kernel_log=None if args.kernel_log == "off" else args.kernel_log,
                            local_offset=local_rank_offset(cmd))
        except Exception as exc:  # noqa: BLE001 - the command runs as it would without us
            print(f"argus run: job log channel off ({exc})", file=sys.stderr)
    try:
        child = subprocess.Popen(cmd, env=env, **(joblog.popen_kwargs() if joblog is not None else {}))
    finally:
        if joblog is not None:
            joblog.start()  # closes our copies of the job's ends either way
    forward = lambda sig, _frame: child.send_signal(sig)  # noqa: E731
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    started, warned = time.monotonic(), False
    starting = processor is not None  # its socket not seen yet
    try:
        while True:
            try:
                code = child.wait(timeout=0.05 if starting else 5.0)
                break
            except subprocess.TimeoutExpired:
                if starting and processor is not None:
                    starting, processor = _starting(sock, processor, log_path, starting_since)
                if (processor is not None and not warned and time.monotonic() - started > NO_RANK_WARN_S
                        and not _ranks_seen(args.store, args.host)):
                    warned = True
                    print(f"argus run: no rank has connected after {NO_RANK_WARN_S:.0f} s; ranks are processes "
                          "that call torch.distributed.init_process_group (set ARGUS_FORCE=1 to trace a job "
                          "without one)", file=sys.stderr)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        while starting and processor is not None:  # the command ended first: the processor's start decides
            starting, processor = _starting(sock, processor, log_path, starting_since)
            if starting:
                time.sleep(0.02)
        if joblog is not None:
            joblog.finish()  # before the processor stops: the attempt's logs go in with the rest
        status, killed = _stop_processor(processor, args.store, args.host) if processor is not None else (0, "")
    if processor is not None:
        if killed:
            sock.unlink(missing_ok=True)  # it could not remove its socket
            print(f"argus run: after the command ended, the processor was killed: {killed} ({_exit_text(status)});"
                  f" its log is {log_path}", file=sys.stderr)
        elif status not in (0, -signal.SIGTERM):
            print(f"argus run: the processor {_exit_text(status)}; its log is {log_path}", file=sys.stderr)
        else:
            log_path.unlink(missing_ok=True)
        if not _ranks_seen(args.store, args.host):
            print(f"argus run: no rank of the command connected, so nothing was traced into {args.store}: ranks are "
                  "processes that call torch.distributed.init_process_group (set ARGUS_FORCE=1 to trace a job "
                  f"without one). The command exited with {code}.", file=sys.stderr)
        else:
            seen = _runs_seen(args.store, args.host)
            runs = ", ".join(seen) or run_id
            for line in _losses(args.store, args.host, seen or [run_id]):  # never a silent gap
                print(f"argus run: the processor {line}", file=sys.stderr)
            print(f"argus run: traced run {runs} into {args.store}  (argus diagnose {args.store})",
                  file=sys.stderr)
    if joblog is not None and joblog.summary():
        where = "kept in the store's logs table" if joblog.written else "not stored: no rank connected"
        print(f"argus run: the job's output had {joblog.summary()} ({where})", file=sys.stderr)
    return code

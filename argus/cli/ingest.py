"""``argus ingest FORMAT``: import what other tools wrote: Kineto traces into a store, Flight Recorder
dumps as hang incidents."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable

from argus.cli.progress import progress_bar, stderr_console, stdout_console
from argus.text import term

__all__ = ["register"]

_MB = 1 << 20

#: Consequences listed one per line; the rest are counted.
MAX_CONSEQUENCE_LINES = 8


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="import traces from other tools into a store",
                       description="Import traces recorded by other tools into an Argus store.")
    fmt = p.add_subparsers(dest="format", metavar="FORMAT")
    fmt.required = True
    k = fmt.add_parser(
        "kineto", help="PyTorch Profiler (Kineto) Chrome-trace JSON, one file per rank",
        description="Import per-rank PyTorch Profiler / Kineto traces (.json or .json.gz): steps from "
                    "ProfilerStep#N, phases from record_function annotations, kernels with their streams. "
                    "Files that cannot be read are reported at the end (exit code 1); the others are imported.")
    k.add_argument("paths", nargs="+", metavar="PATH", help="trace files, or directories holding them")
    k.add_argument("--out", required=True, help="store directory (new, empty, or an existing store)")
    k.add_argument("--layout", default="",
                   help="parallel layout of the job, e.g. 'tp=2,pp=4,dp=8' (sizes multiply to the world size; "
                        "dp may be left out when the traces carry distributedInfo.world_size). Default: pure "
                        "data parallelism over distributedInfo.world_size (or the highest rank present)")
    k.add_argument("--order", help="rank order, fastest axis first (default tp-cp-ep-dp-pp)")
    k.add_argument("--gpus-per-host", type=int, default=8, help="ranks per host (default 8)")
    k.add_argument("--run-id", help="run id for the imported attempt (default: kineto-<random>)")
    k.add_argument("--jobs", type=int, help="parsing processes (default: automatic, parallel for big inputs)")
    k.add_argument("--json", action="store_true", help="print the import summary as JSON on stdout")
    k.set_defaults(func=run_ingest_kineto)
    o = fmt.add_parser(
        "ops", help="per-op timelines (Parquet or CSV: stage, dp_rank, step, optype, start_ts, duration)",
        description="Import a per-op timeline of a pipeline job — one row per operation a rank ran, with its stage, "
                    "data-parallel index, step, op type (forward-compute, backward-recv, grads-reduce-scatter, …), "
                    "start and duration in seconds — the format of the OSDI 2025 what-if analysis artifact. One "
                    "window per step; the traced ranks (one per tensor-parallel group, as such traces hold) become "
                    "the store's ranks.")
    o.add_argument("path", metavar="PATH", help="the timeline (.parquet or .csv)")
    o.add_argument("--out", required=True, help="store directory (new, empty, or an existing store)")
    o.add_argument("--meta", help="the job's sizes (the artifact's meta-*.yaml: pp_size, dp_size, tp_size, …)")
    o.add_argument("--gpus-per-host", type=int, default=8, help="GPUs per host, for placing the trace's global ranks "
                                                                "(default 8)")
    o.add_argument("--run-id", help="run id for the imported attempt (default: optrace-<random>)")
    o.add_argument("--no-microbatch-labels", action="store_true",
                   help="drop the microbatch ids (mb_id) the trace holds, as traces without them read")
    o.add_argument("--json", action="store_true", help="print the import summary as JSON on stdout")
    o.set_defaults(func=run_ingest_ops)
    f = fmt.add_parser(
        "flight-recorder", help="PyTorch Flight Recorder dumps, one file per rank: who never joined a stuck collective",
        description="Read the per-rank dumps a hung job's process groups wrote (TORCH_NCCL_DEBUG_INFO_TEMP_FILE "
                    "<prefix><rank>, or _dump_fr_trace), pickle or JSON, with an unpickler that builds plain data "
                    "only (a file naming any Python object is refused), and report a hang incident per stuck "
                    "collective: the ranks that never joined it, those waiting in it and where, mismatched "
                    "collectives, ranks whose dump is missing or empty. Exit code 1 when a collective is stuck.")
    f.add_argument("paths", nargs="+", metavar="PATH", help="dump files, or directories holding them")
    f.add_argument("--prefix", help="file name prefix before the rank number (default: the only one present)")
    f.add_argument("--world", type=int, help="ranks in the job (default: the highest rank seen + 1); ranks "
                                               "without a dump are then named")
    f.add_argument("--store", help="the job's Argus store: culprits get their hosts, and the incidents are stored "
                                   "in its latest attempt next to the diagnosis")
    f.add_argument("--json", action="store_true", help="print the incidents as JSON on stdout")
    f.set_defaults(func=run_ingest_flight_recorder)
    lg = fmt.add_parser(
        "log", help="a finished job's logs (torchrun, Slurm, Kubernetes): who failed, who the others waited for",
        description="Read a job's existing log files (or stdin: '-') with the scanner argus run uses live: "
                    "uncaught exceptions, CUDA/ECC errors, out of memory, Xid, NCCL errors and warnings, watchdog "
                    "timeouts, PyTorch's desync report, torchrun's failure report — each with the rank its line "
                    "carries ([rank12], Rank 12, srun --label's task; torchrun's [default0] is a local rank, global "
                    "only with --node-rank/--nproc-per-node). Prints one incident per fault; with --dumps, the "
                    "Flight Recorder dumps of the same failure join the same verdict. Exit code 1 when the logs "
                    "name a failure or a hang.")
    lg.add_argument("paths", nargs="+", metavar="FILE", help="log files ('-': standard input)")
    lg.add_argument("--dumps", nargs="+", metavar="PATH", help="the same failure's Flight Recorder dumps (files or "
                                                               "directories)")
    lg.add_argument("--world", type=int, help="ranks in the job (default: the highest rank seen + 1)")
    lg.add_argument("--node-rank", type=int, help="the node these logs are from (torchrun's --node-rank): maps its "
                                                  "[defaultN] local ranks to global ones, with --nproc-per-node")
    lg.add_argument("--nproc-per-node", type=int, help="ranks per node (torchrun's --nproc-per-node)")
    lg.add_argument("--store", help="the job's Argus store: the events are kept in its latest attempt's logs table "
                                    "(argus diagnose then puts them next to its incidents), culprits get their hosts")
    lg.add_argument("--json", action="store_true", help="print the events and incidents as JSON on stdout")
    lg.set_defaults(func=run_ingest_log)


class _ByteProgress:
    """Adapts byte counts to a progress bar counted in MB."""

    def __init__(self, advance: Callable[..., None]):
        self._advance, self._bytes, self._shown = advance, 0, 0

    def __call__(self, n: int) -> None:
        self._bytes += n
        mb = self._bytes // _MB
        if mb > self._shown:
            self._advance(mb - self._shown)
            self._shown = mb


def _size(path: object) -> int:
    try:
        return os.path.getsize(path)  # type: ignore[arg-type]
    except OSError:  # a dangling link: the reader reports it
        return 0


def run_ingest_kineto(args: argparse.Namespace) -> int:
    from argus.kineto import find_trace_files, import_traces, read_traces
    from argus.store import Store
    from argus.topology import parse_layout

    parse_layout(args.layout, order=args.order)  # a typo fails now, not after minutes of parsing
    files = find_trace_files(args.paths)
    Store.create(args.out)  # so does an --out that is not a store
    total = sum(_size(f) for f in files)
    t0 = time.perf_counter()
    with progress_bar(f"reading {len(files)} trace file{'s' * (len(files) != 1)}", max(1, total // _MB)) as adv:
        traces, failures = read_traces(files, jobs=args.jobs, on_bytes=_ByteProgress(adv))
    parse_s = time.perf_counter() - t0
    steps = {int(s) for t in traces for s in t.steps.step}
    with progress_bar("writing windows", max(1, len(steps))) as adv:
        result = import_traces(traces, args.out, args.layout, order=args.order, gpus_per_host=args.gpus_per_host,
                               run_id=args.run_id, failures=failures, on_window=lambda step: adv())
    err = stderr_console()
    if args.json:
        print(json.dumps({
            "store": str(result.store), "run_id": result.run_id, "attempt_id": result.attempt_id,
            "layout": result.layout, "world_size": result.world_size, "ranks": result.ranks, "rows": result.rows,
            "parse_s": round(parse_s, 3), "write_s": round(result.write_s, 3),
            "files": [f.__dict__ for f in result.files], "events_left_out": sum(
                n["events"] for f in result.files for n in f.rejected.values()),
            "failures": [{"path": f.path, "problem": str(f)} for f in result.failures]}, indent=2))
    else:
        from rich.table import Table

        out = stdout_console()
        table = Table(title=f"imported into {result.store} (run {result.run_id}, layout {result.layout})",
                      title_justify="left")
        for col in ("rank", "file", "steps", "phases", "kernels", "MB", "MB/s"):
            table.add_column(col, justify="left" if col == "file" else "right")
        for f in result.files:
            rate = f.bytes_read / f.parse_s / 1e6 if f.parse_s > 0 else 0.0
            table.add_row(str(f.rank), term(os.path.basename(f.path)), str(f.steps), f"{f.phases:,}", f"{f.kernels:,}",
                          f"{f.bytes_read / 1e6:.1f}", f"{rate:.0f}")
        out.print(table)
        out.print(f"{len(result.files)} rank{'s' * (len(result.files) != 1)} of {result.world_size}; "
                  + ", ".join(f"{n:,} {t}" for t, n in result.rows.items())
                  + f"; parsed in {parse_s:.2f} s, written in {result.write_s:.2f} s")
        for f in result.files:
            for note in f.notes:
                err.print(f"[yellow]note[/yellow] {term(f.path)}: {term(note)}")
            for what, n in f.dropped.items():
                err.print(f"[yellow]note[/yellow] {term(f.path)}: {n:,} {what} outside every ProfilerStep were left out")
            for line in f.rejected_lines:
                err.print(f"[yellow]left out[/yellow] {term(f.path)}: {term(line)}")
    for failure in result.failures:
        err.print(f"[red]failed[/red] {term(failure)}")
    if result.failures:
        err.print(f"[red]{len(result.failures)} of {len(files)} files not imported[/red]")
        return 1
    return 0


def run_ingest_ops(args: argparse.Namespace) -> int:
    from argus.optrace import import_ops, read_meta, read_ops

    sizes = read_meta(args.meta) if args.meta else None
    with progress_bar("reading the timeline", 1) as adv:
        trace = read_ops(args.path)
        adv()
    result = import_ops(trace, args.out, sizes=sizes, gpus_per_host=args.gpus_per_host, run_id=args.run_id,
                        microbatch_labels=not args.no_microbatch_labels)
    if args.json:
        print(json.dumps({"store": str(result.store), "run_id": result.run_id, "attempt_id": result.attempt_id,
                          "layout": result.layout, "steps": result.steps, "ops": result.ops,
                          "write_s": round(result.write_s, 3), "notes": result.notes}, indent=2))
    else:
        out = stdout_console()
        out.print(f"imported {result.ops:,} ops of {result.steps} step{'s' * (result.steps != 1)} into "
                  f"{term(str(result.store))} (run {result.run_id}, layout {result.layout}) in {result.write_s:.2f} s")
        for note in result.notes:
            stderr_console().print(f"[yellow]note[/yellow] {term(note)}")
    return 0


def run_ingest_flight_recorder(args: argparse.Namespace) -> int:
    from pathlib import Path

    from argus.analysis.incident import incidents_table
    from argus.errors import ConfigError
    from argus.flight_recorder import hang_incidents, hang_step, keep_dumps, read_dumps, stuck_collectives

    if args.world is not None and args.world < 1:
        raise ConfigError(f"--world must be at least 1 (got {args.world})")
    ds = read_dumps([Path(p) for p in args.paths], prefix=args.prefix, world=args.world)
    stuck = stuck_collectives(ds)
    attempt = None
    step = -1
    if args.store:
        from argus.store import Store

        attempt = Store.open(args.store).attempt()
        step = hang_step(attempt)
        keep_dumps(attempt, ds)  # every later diagnosis of the store reads them into its hang
    incidents = hang_incidents(ds, stuck, step=step)
    if attempt is not None:
        topo = attempt.topology()
        for inc in incidents:
            inside = [r for r in inc.culprit_ranks if 0 <= r < attempt.layout.world_size]
            inc.hosts = sorted({str(topo.hosts[r]) for r in inside})
            inc.gpus = [str(topo.gpu_uuids[r]) for r in inside]
        if incidents:
            attempt.writer("flight-recorder").write("incidents", incidents_table(incidents),
                                                    window=len(attempt.files("incidents")))
    err = stderr_console()
    if args.json:
        print(json.dumps({"world": ds.world, "dumps": sorted(ds.dumps), "unreadable": {
            str(r): why for r, why in sorted(ds.unreadable.items())}, "missing": ds.missing,
            "stuck": [s.to_json() for s in stuck], "incidents": [i.to_json() for i in incidents]}, indent=2))
    else:
        out = stdout_console()
        versions = sorted({d.version for d in ds.dumps.values()})
        out.print(f"{len(ds.dumps)} dump{'s' * (len(ds.dumps) != 1)} of {ds.world} ranks read "
                  f"(format {', '.join(versions) or '?'}); {len(stuck)} stuck collective{'s' * (len(stuck) != 1)}")
        for inc in incidents:
            out.print(f"[bold red]hang[/bold red] ({inc.state}) {term(inc.summary)}")
        waits = [s for s in stuck if s.consequence and s.behind]
        for s in waits[:MAX_CONSEQUENCE_LINES]:
            out.print(f"  consequence: {term(s.group_desc or s.group)} #{s.seq} waits for "
                      f"{', '.join(map(str, s.behind[:16]))}, who wait in another stuck collective")
        # issued by every member and blocked behind the fault: counted per group kind, not listed
        blocked: dict[str, int] = {}
        for s in stuck:
            if s.consequence and not s.behind:
                key = f"{s.op.split(':')[-1] or 'collective'} of {s.group_desc or 'group ' + s.group}"
                blocked[key] = blocked.get(key, 0) + 1
        if len(waits) > MAX_CONSEQUENCE_LINES or blocked:
            parts = [f"{n} × {term(k)}" for k, n in sorted(blocked.items(), key=lambda kv: -kv[1])]
            if len(waits) > MAX_CONSEQUENCE_LINES:
                parts.insert(0, f"{len(waits) - MAX_CONSEQUENCE_LINES} more waiting for ranks stuck elsewhere")
            out.print(f"  blocked behind it, issued by every member: {', '.join(parts)}")
        if not stuck:
            out.print("no collective is stuck: every member of every group completed what it enqueued")
        if attempt is not None and incidents:
            out.print(f"stored in {term(str(attempt.path))}")
    for r, why in sorted(ds.unreadable.items()):
        err.print(f"[yellow]unreadable[/yellow] rank {r}: {term(why)}")
    for r in ds.missing:
        if r not in ds.unreadable:
            err.print(f"[yellow]missing[/yellow] no dump from rank {r}")
    return 1 if stuck else 0


def run_ingest_log(args: argparse.Namespace) -> int:
    import sys
    from contextlib import ExitStack
    from pathlib import Path

    from argus.errors import ConfigError
    from argus.joblog.offline import log_incidents, read_logs

    for name in ("world", "nproc_per_node"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got {v})")
    if args.node_rank is not None and (args.node_rank < 0 or args.nproc_per_node is None):
        raise ConfigError("--node-rank needs --nproc-per-node, and is at least 0")
    offset = args.node_rank * args.nproc_per_node if args.node_rank is not None else None
    attempt, topology = None, None
    if args.store:
        from argus.store import Store

        attempt = Store.open(args.store).attempt()
        topology = attempt.topology()
    with ExitStack() as stack:
        sources = []
        for p in args.paths:
            if p == "-":
                sources.append(("<stdin>", sys.stdin.buffer))
                continue
            try:
                sources.append((p, stack.enter_context(open(Path(p), "rb"))))
            except OSError as exc:
                raise ConfigError(f"{p}: cannot read it ({exc.strerror or exc})") from None
        read = read_logs(sources, local_offset=offset, nproc_per_node=args.nproc_per_node)
    start = []
    if attempt is not None and topology is not None and not args.dumps:
        from argus.flight_recorder import with_kept_dumps

        start = with_kept_dumps(attempt, topology, [])  # the dumps an earlier ingest kept there
    incidents, ds = log_incidents(read, [Path(p) for p in args.dumps] if args.dumps else None, args.world, topology,
                                  start)
    if attempt is not None and topology is not None and read.events:
        import time as _time

        from argus.store import conform

        cols: dict[str, list] = {k: [] for k in ("rank", "ts_ns", "host", "stream", "kind", "severity", "text",
                                                  "lines")}
        base = _time.time_ns()  # ingested now; the input's order kept
        for e in read.events:
            host = str(topology.hosts[e["rank"]]) if 0 <= e["rank"] < topology.world_size else e["host"]
            for k, v in zip(cols, (e["rank"], base + e["ts_ns"], host, "ingest", e["kind"], e["severity"], e["text"],
                                   1)):
                cols[k].append(v)
        attempt.writer("ingest-log").write("logs", conform("logs", cols), window=len(attempt.files("logs")))
    kinds: dict[str, int] = {}
    for e in read.events:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    if args.json:
        print(json.dumps({"lines": read.lines, "events": read.events, "unmatched_lines": read.other,
                          "events_left_out": read.dropped, "srun_labelled": read.srun_labelled,
                          "incidents": [i.to_json() for i in incidents]}, indent=2, default=str))
    else:
        out = stdout_console()
        said = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])) or "none known"
        out.print(f"{read.lines:,} lines read; events: {said}"
                  + (f" (srun --label: {', '.join(map(term, read.srun_labelled))})" if read.srun_labelled else ""))
        for inc in incidents:
            where = f" on {', '.join(map(term, inc.hosts))}" if inc.hosts else ""
            out.print(f"[bold red]{inc.klass}[/bold red] ({inc.state}){where} {term(inc.summary)}")
        if not incidents:
            out.print("no failure and no hang in these logs")
        if attempt is not None and read.events:
            out.print(f"events kept in {term(str(attempt.path))} (logs table): argus diagnose puts them next to its "
                      "incidents")
    return 1 if incidents else 0

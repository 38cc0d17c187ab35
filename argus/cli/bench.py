"""``argus bench NAME``: benchmarks, each printing one JSON object per line."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark (prints JSON lines)",
                       description="Benchmarks. Each prints one JSON object per line with its figures.")
    bsub = p.add_subparsers(dest="bench", metavar="NAME")
    bsub.required = True
    s = bsub.add_parser("simulate", help="simulator throughput (events/s) and peak memory")
    s.add_argument("--ranks", type=int, default=10240)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--layout", help="parallel layout (default: realistic for the size)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--modes", default="generate,store",
                   help="comma list: generate (events only), store (write steps/phases/stacks/hw), "
                        "store+kernels (also raw kernels)")
    s.set_defaults(func=_run_simulate)

    c = bsub.add_parser("compression", help="summary bytes per rank-step and reconstruction fidelity")
    c.add_argument("--ranks", type=int, default=64)
    c.add_argument("--window-steps", type=int, nargs="+", default=[10, 20])
    c.add_argument("--hosts", type=int, default=1, help="hosts (8 ranks each) to report")
    c.add_argument("--workload", choices=["standard", "production"], default="standard",
                   help="standard: the simulator's job (~900 launches per rank-step); production: one stage of a "
                        "large dense + MoE job (~12,400 launches of 207 kernels), its mix beside the real traces'")
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=_run_compression)

    a = bsub.add_parser("analysis", help="L1–L3 over one window of a large job: wall time and peak memory")
    a.add_argument("--ranks", type=int, default=10240)
    a.add_argument("--steps", type=int, default=10)
    a.add_argument("--window", default="5:9", help="steps of the analysed window, A:B (default 5:9)")
    a.add_argument("--store", help="diagnose this store instead of simulating one")
    a.add_argument("--scenario", default="compute_straggler")
    a.set_defaults(func=_run_analysis)

    r = bsub.add_parser("report", help="argus report on a large job: wall time (diagnosis included) and file size")
    r.add_argument("--store", help="report this store (default: simulate --ranks × --steps of --scenario)")
    r.add_argument("--out", help="keep the report here (default: a temp file, deleted)")
    r.add_argument("--ranks", type=int, default=10240)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--scenario", default="compute_straggler")
    r.set_defaults(func=_run_report)

    o = bsub.add_parser("overhead", help="tracing cost on a real CPU training job: none vs Argus vs torch.profiler")
    o.add_argument("--ranks", type=int, default=2, help="training processes (default 2)")
    o.add_argument("--steps", type=int, default=150, help="steps per run (default 150)")
    o.add_argument("--model", choices=["base", "tiny"], default="base",
                   help="base: ~130 ms steps on one core; tiny: ~20 ms (fixed per-step costs weigh most)")
    o.add_argument("--repeats", type=int, default=2, help="runs per mode, interleaved (default 2)")
    o.add_argument("--modes", default="none,argus-semantic,argus-ops,argus,profiler",
                   help="comma list of modes (default: all)")
    o.add_argument("--op-sample-every", type=int, default=None,
                   help="CPU-op channel: capture one step in N (default: the producer's default)")
    o.set_defaults(func=_run_overhead)

    g = bsub.add_parser("gpu-overhead", help="tracing cost on one CUDA GPU (GPT-2-class, bf16) and CUPTI vs "
                                             "torch.profiler kernel lists")
    from argus.bench import cupti_parse, gpu_overhead, sdc  # light: torch is imported when they run

    gpu_overhead.add_arguments(g)
    g.set_defaults(func=gpu_overhead.run_args)

    cu = bsub.add_parser("cupti", help="a CUPTI activity buffer on CUPTI's thread: µs per record, per-record "
                                       "loop vs vectorised")
    cupti_parse.add_arguments(cu)
    cu.set_defaults(func=cupti_parse.run_args)

    sd = bsub.add_parser("sdc", help="the correctness sensors' CPU on the training thread, per sensor, as a share "
                                     "of a training step's CPU")
    sdc.add_arguments(sd)
    sd.set_defaults(func=sdc.run_args)

    ac = bsub.add_parser("accuracy", help="every scenario × seeds × sizes, scored against truth.json")
    ac.add_argument("--sizes", default="64,512,4096", help="comma list of rank counts")
    ac.add_argument("--seeds", type=int, default=5)
    ac.add_argument("--scenarios", help="comma list (default: all)")
    ac.add_argument("--jobs", type=int, default=2, help="parallel runs")
    ac.add_argument("--runs", action="store_true", help="also print every run's score")
    ac.add_argument("--held-out", type=int, metavar="N",
                    help="instead: N jobs per scenario drawn from held-out seeds (10000+) with random layouts, "
                         "noise and fault magnitudes; scored per measured fault cost (see argus.bench.heldout)")
    ac.add_argument("--seed0", type=int, default=None, metavar="S",
                    help="with --held-out: the first evaluation seed (default 10000; seeds once looked at while "
                         "developing are no longer held out — move on to fresh ones)")
    ac.add_argument("--real-trace", action="store_true",
                    help="instead: jobs of 4–16 ranks built from a real PyTorch Profiler trace, healthy and with "
                         "compute stragglers injected consistently (see argus.bench.realtrace)")
    ac.set_defaults(func=_run_accuracy)

    pe = bsub.add_parser("peers", help="Argus beside Holistic Trace Analysis: culprit precision/recall vs truth.json")
    pe.add_argument("--ranks", type=int, default=16, help="ranks per job (HTA loads every rank's whole trace)")
    pe.add_argument("--steps", type=int, default=12)
    pe.add_argument("--seeds", type=int, default=3)
    pe.add_argument("--scenarios", help="comma list (default: all, healthy included)")
    pe.add_argument("--runs", action="store_true", help="also print every run's scores")
    pe.set_defaults(func=_run_peers)

    wi = bsub.add_parser("whatif", help="the attribution on real jobs' public per-op timelines (ByteDance Seed's "
                                        "what-if artifact) against the slowdowns and root causes they published")
    wi.add_argument("--data", help="folder of trace-*.parquet, meta-*.yaml and published.json "
                                   "(default: the checkout's tests/data/stragglers)")
    wi.add_argument("--traces", help="comma list (default: every trace in published.json)")
    wi.add_argument("--labels", choices=["both", "yes", "no"], default="both",
                    help="import with the traces' microbatch labels, without them, or both (default)")
    wi.set_defaults(func=_run_whatif)

    hc = bsub.add_parser("healthcheck", help="argus healthcheck --quick run N times against one baseline on this "
                                             "(healthy) node: the false-fail rate")
    hc.add_argument("--runs", type=int, default=30, help="quick checks after the baseline (default 30)")
    hc.add_argument("--baseline-dir", help="where the baseline goes (default: a temporary directory)")
    hc.add_argument("--load", action="store_true",
                    help="with one process spinning on a CPU beside every check after the baseline: how often the "
                         "check says the node is loaded (exit 3) rather than failing it")
    hc.add_argument("--links", type=float, default=None, metavar="FRACTION",
                    help="instead: the net level across 4 network-namespace hosts, --runs checks as they are, then "
                         "--runs with one host's link limited by tc tbf to FRACTION (e.g. 0.8) of its measured bus "
                         "bandwidth: the false-fail and detection rates (needs root)")
    hc.add_argument("--drift", type=float, default=None, metavar="SECONDS",
                    help="instead: the memory-copy figure measured every half second for SECONDS (e.g. 420), and "
                         "every baseline and later check in that series judged with a failing figure measured again "
                         "at once or after 0, 5 and 10 s: the false-fail rate of each")
    hc.set_defaults(func=_run_healthcheck)

    p = bsub.add_parser("processor", help="compression rate, socket throughput, CPU at a paced rate, memory")
    p.add_argument("--modes", default="compression,throughput,paced,long",
                   help="comma list of: compression, evidence (Perfetto encoder, before/after in process), "
                        "throughput, paced, long")
    p.add_argument("--workload", choices=["standard", "production"], default="standard",
                   help="what the clients send (throughput, paced, long): standard, the simulator's job (~1,350 "
                        "events per rank-step); production, its steps and phases with the production workload's "
                        "12,370 kernel launches per rank-step")
    p.add_argument("--events", type=float, default=5e6, help="events for the throughput mode")
    p.add_argument("--long-events", type=float, default=1e8, help="events for the long (memory) mode")
    p.add_argument("--long-rate", type=float, default=500_000,
                   help="events per second (all ranks) for the long mode: a rate the writer sustains")
    p.add_argument("--rate", type=float, default=100_000, help="events per minute per rank for the paced mode")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of the paced mode")
    p.add_argument("--no-evidence", action="store_true", help="processor without Perfetto evidence")
    p.add_argument("--evidence-interval", type=float, default=0.0,
                   help="seconds between evidence traces of normal windows (default 0: every window, the "
                        "worst case; the processor's own default is 10, slow windows always)")
    p.set_defaults(func=_run_processor)

    rw = bsub.add_parser("remote-write", help="Prometheus remote-write sink: samples/s and bytes per rank-step "
                                              "against the 10,000-GPU budget")
    rw.add_argument("--windows", type=int, default=40, help="host windows (8 ranks × 5 steps) to send (default 40)")
    rw.add_argument("--url", help="remote-write endpoint, e.g. VictoriaMetrics' http://127.0.0.1:8428/api/v1/write "
                                  "(default: a local HTTP server that discards)")
    rw.add_argument("--step-s", type=float, default=1.0, help="step time assumed for the budget (default 1 s)")
    rw.add_argument("--workload", choices=["standard", "production"], default="standard",
                    help="kernel summaries of the simulator's kernels (standard) or of the production workload's "
                         "12,370 launches per rank-step (production)")
    rw.set_defaults(func=lambda a: __import__("argus.bench.remote_write", fromlist=["main"]).main(a))

    pf = bsub.add_parser("perfetto", help="one host-window's Perfetto evidence trace (8 ranks × 5 steps): CPU "
                                          "seconds, µs per event, bytes")
    pf.add_argument("--workload", choices=["standard", "production"], default="production",
                    help="the window's kernels: production (12,370 launches per rank-step, default) or standard")
    pf.add_argument("--repeat", type=int, default=3, help="builds; the best CPU time is reported (default 3)")
    pf.add_argument("--before", metavar="TREE",
                    help="also build with TREE/argus/evidence/perfetto.py (e.g. a git worktree of an older commit), "
                         "interleaved: before/after CPU and whether the bytes are identical")
    pf.add_argument("--overlapping", action="store_true",
                    help="lay each step's kernels 0.8 s earlier per step, so every stream overlaps the next step's "
                         "(the lane assignment's worst case)")
    pf.set_defaults(func=_run_perfetto)


def _run_simulate(args: argparse.Namespace) -> int:
    from argus.bench.simulate import run_isolated

    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        result = run_isolated(ranks=args.ranks, steps=args.steps, layout=args.layout, seed=args.seed, mode=mode)
        print(json.dumps(result), flush=True)
    return 0


def _run_compression(args: argparse.Namespace) -> int:
    from argus.bench.compression import real_trace_mix, run

    if args.workload == "production":
        for row in real_trace_mix():
            print(json.dumps(row), flush=True)
    for w in args.window_steps:
        for row in run(ranks=args.ranks, window_steps=w, hosts=args.hosts, seed=args.seed, workload=args.workload):
            print(json.dumps(row), flush=True)
    return 0


def _run_processor(args: argparse.Namespace) -> int:
    from argus.bench.processor import run_compression, run_evidence, run_socket

    evidence = not args.no_evidence
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        if mode == "compression":
            row = run_compression()
        elif mode == "evidence":
            row = run_evidence()
        elif mode == "throughput":
            row = run_socket("throughput", events=int(args.events), evidence=evidence,
                             evidence_interval_s=args.evidence_interval, workload=args.workload)
        elif mode == "paced":
            row = run_socket("paced", events=None, rate_per_min_per_rank=args.rate, duration_s=args.duration,
                             evidence=evidence, evidence_interval_s=args.evidence_interval, workload=args.workload)
        elif mode == "long":
            row = run_socket("long", events=int(args.long_events), rate_per_min_per_rank=args.long_rate * 60 / 8,
                             evidence=evidence, evidence_interval_s=args.evidence_interval, workload=args.workload)
        else:
            from argus.errors import ConfigError

            raise ConfigError(f"unknown processor bench mode {mode!r}")
        print(json.dumps(row), flush=True)
    return 0


def _run_perfetto(args: argparse.Namespace) -> int:
    from argus.bench.processor import run_perfetto

    print(json.dumps(run_perfetto(workload=args.workload, repeat=args.repeat, before=args.before,
                                  overlapping=args.overlapping)), flush=True)
    return 0


def _run_analysis(args: argparse.Namespace) -> int:
    from argus.bench.analysis import run

    lo, _, hi = args.window.partition(":")
    print(json.dumps(run(ranks=args.ranks, steps=args.steps, window=(int(lo), int(hi)), store=args.store,
                         scenario=args.scenario)), flush=True)
    return 0


def _run_healthcheck(args: argparse.Namespace) -> int:
    from argus.bench.healthcheck import drift, links, run
    from argus.errors import ConfigError

    if args.drift is not None:
        if not 60 <= args.drift <= 86400:
            raise ConfigError(f"--drift {args.drift}: seconds to record, from 60 (a baseline and a check after it)")
        drift(args.drift)
        return 0
    if args.runs < 1:
        raise ConfigError(f"--runs must be at least 1 (got {args.runs})")
    if args.links is not None:
        if not 0 < args.links < 1:
            raise ConfigError(f"--links {args.links}: a fraction of the measured bandwidth, between 0 and 1")
        links(args.runs, args.links)
        return 0
    run(args.runs, args.baseline_dir, load=args.load)
    return 0


def _run_whatif(args: argparse.Namespace) -> int:
    from argus.bench.whatif import run

    labels = {"both": (True, False), "yes": (True,), "no": (False,)}[args.labels]
    for row in run(data=args.data, traces=args.traces.split(",") if args.traces else None, labels=labels):
        print(json.dumps(row), flush=True)
    return 0


def _run_report(args: argparse.Namespace) -> int:
    from argus.bench.report import run

    print(json.dumps(run(store=args.store, out=args.out, ranks=args.ranks, steps=args.steps,
                         scenario=args.scenario)), flush=True)
    return 0


def _scored_runs(label: str, func, jobs: list[tuple], args: argparse.Namespace, summarize) -> int:
    """Run ``func(*job)`` for every job in a process pool (a progress bar; each score as JSON
    with ``--runs``), then print the summary rows."""
    from concurrent.futures import ProcessPoolExecutor

    from argus.cli.progress import progress_bar

    scores = []
    with progress_bar(label, len(jobs)) as advance, ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for score in pool.map(func, *zip(*jobs)):
            scores.append(score)
            advance()
            if args.runs:
                print(json.dumps(score.to_json()), flush=True)
    for row in summarize(scores):
        print(json.dumps(row), flush=True)
    return 0


def _run_accuracy(args: argparse.Namespace) -> int:
    from argus.sim import SCENARIOS

    scenarios = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
    if args.real_trace:
        from argus.bench.realtrace import real_trace_jobs, score_real_trace, summarize_real_traces

        return _scored_runs("real-trace runs", score_real_trace, [(j,) for j in real_trace_jobs()], args,
                            summarize_real_traces)
    if args.held_out:
        from argus.bench.heldout import HELD_OUT_SEED0, MAGNITUDES, run_draw, summarize_held_out

        jobs = []
        for sc in scenarios:
            values = MAGNITUDES[sc][1] if sc in MAGNITUDES else (None,)
            seed0 = HELD_OUT_SEED0 if args.seed0 is None else args.seed0
            jobs += [(sc, seed0 + i, values[i % len(values)]) for i in range(args.held_out)]
        return _scored_runs("held-out runs", run_draw, jobs, args, summarize_held_out)
    from argus.bench.accuracy import run_one, summarize

    jobs = [(sc, int(size), seed) for size in args.sizes.split(",") for sc in scenarios for seed in range(args.seeds)]
    return _scored_runs("accuracy runs", run_one, jobs, args, summarize)


def _run_peers(args: argparse.Namespace) -> int:
    from argus.bench.peers import require_peers, run_one, summarize
    from argus.cli.progress import progress_bar
    from argus.sim import SCENARIOS

    scenarios = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
    require_peers(scenarios)
    jobs = [(sc, seed) for sc in scenarios for seed in range(args.seeds)]
    runs = []
    with progress_bar("peer runs", len(jobs)) as advance:
        for scenario, seed in jobs:
            runs.append(run_one(scenario, seed, ranks=args.ranks, steps=args.steps))
            advance()
            if args.runs:
                print(json.dumps(runs[-1].to_json()), flush=True)
    for row in summarize(runs):
        print(json.dumps(row), flush=True)
    return 0


def _run_overhead(args: argparse.Namespace) -> int:
    from argus.bench.overhead import run_overhead
    from argus.producer.config import ProducerConfig

    try:
        import torch  # noqa: F401
    except ImportError:
        print("argus bench overhead: needs PyTorch (pip install 'argus-trace[torch]')", file=sys.stderr)
        return 2
    every = args.op_sample_every or ProducerConfig().op_sample_every
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    try:
        for row in run_overhead(args.ranks, args.steps, args.repeats, modes, every, args.model):
            print(json.dumps(row), flush=True)
    except (ValueError, RuntimeError) as exc:
        print(f"argus bench overhead: {exc}", file=sys.stderr)
        return 2
    return 0

"""The PromQL Argus's dashboards and alert rules run over the series of ``argus.tsdb``.

One place for every expression, so the Grafana panels, the alert rules and the test that
runs each of them against a real Prometheus all use the same text. ``$job`` and ``$run``
are Grafana template variables; alert rules aggregate over every job and run instead.
"""

from __future__ import annotations

__all__ = ["SEL", "PANELS", "RULES", "Panel", "Rule", "substitute", "watcher_rules", "PROCESSOR_SILENT_S",
           "JOB_SILENT_S"]

from dataclasses import dataclass

from argus.vocab import GroupKind

SEL = 'job="$job", run=~"$run"'


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries | heatmap | bargauge | stat
    exprs: tuple[tuple[str, str], ...]  # (legend, PromQL)
    unit: str = "s"
    description: str = ""


@dataclass(frozen=True)
class Rule:
    name: str
    priority: str  # P0 | P1 | P2
    expr: str
    for_: str
    summary: str


PANELS: tuple[Panel, ...] = (
    Panel("Job step time", "timeseries", (
        ("median over ranks", f'quantile by (run) (0.5, argus_step_duration_seconds{{{SEL}}} < +Inf)'),
        ("slowest rank", f'max by (run) (argus_step_duration_seconds{{{SEL}}} < +Inf)'),
    ), description="Step wall time; Argus alerts are shown as annotations."),
    Panel("Straggler ratio (slowest rank's compute / median)", "timeseries", (
        ("ratio", f'max by (run) (sum by (run, rank) (argus_phase_seconds{{{SEL}, category="compute"}} '
                  f'- argus_phase_wait_seconds{{{SEL}, category="compute"}})) / quantile by (run) (0.5, sum by '
                  f'(run, rank) (argus_phase_seconds{{{SEL}, category="compute"}} - argus_phase_wait_seconds{{{SEL}, '
                  f'category="compute"}}))'),
    ), unit="none", description="1.0 = every rank computes like the median; a straggler lifts it."),
    Panel("Rank × time: busy seconds of $phase", "heatmap", (
        ("{{rank}}", f'sum by (rank) (argus_phase_seconds{{{SEL}, phase=~"$phase"}} - '
                     f'argus_phase_wait_seconds{{{SEL}, phase=~"$phase"}})'),
    ), description="One row per rank: a straggler is a bright row."),
    Panel("Rank × phase: busy seconds per step (top 20 ranks)", "bargauge", (
        ("{{rank}} {{phase}}", f'topk(20, sum by (rank, phase) (argus_phase_seconds{{{SEL}, category="compute"}} - '
                                f'argus_phase_wait_seconds{{{SEL}, category="compute"}}))'),
    )),
    Panel("Data-parallel transfer time per group", "timeseries", (
        ("{{phase}} tp={{tp}} pp={{pp}}", f'min by (phase, tp, pp) (argus_phase_min_seconds{{{SEL}, category="comm", '
                                          f'group="dp"}})'),
    ), description="A group's fastest member's collective time: its transfer, not waiting. One slow group "
                   "above the others is a degraded link."),
    Panel("Communication kernel quantiles per group", "timeseries", (
        ("p50 {{kernel}} pp={{pp}}", f'max by (kernel, pp) (argus_kernel_p50_seconds{{{SEL}, category="comm"}})'),
        ("p99 {{kernel}} pp={{pp}}", f'max by (kernel, pp) (argus_kernel_p99_seconds{{{SEL}, category="comm"}})'),
    )),
    Panel("Hardware: SM clock, temperature", "timeseries", (
        ("sm clock {{host}}", f'min by (host) (argus_hw{{{SEL}, metric="sm_clock_mhz"}})'),
        ("temperature {{host}}", f'max by (host) (argus_hw{{{SEL}, metric="temperature_c"}})'),
    ), unit="none"),
    Panel("Hardware: PCIe links below their maximum", "stat", (
        ("degraded links", f'count(argus_hw{{{SEL}, metric="pcie_gen"}} < on (run, rank) '
                           f'argus_hw{{{SEL}, metric="pcie_gen_max"}}) or vector(0)'),
    ), unit="none"),
    Panel("Argus health: seconds since each processor was heard", "timeseries", (
        ("{{host}}", 'time() - max by (host) (max_over_time(argus_processor_heartbeat_seconds{job="$job"}[1h]))'),
    ), description="A processor sends a heartbeat every 15 s; a rising line is a host Argus no longer sees."),
    Panel("Argus health: windows waiting to be written, per processor", "timeseries", (
        ("{{host}}", 'max by (host) (argus_processor_queued_windows{job="$job"})'),
    ), unit="none"),
    Panel("Records dropped by processors", "timeseries", (
        ("{{host}} {{table}}", f'sum by (host, table) (argus_dropped_events{{{SEL}}})'),
    ), unit="none", description="What an analysis did not see: overload, unreachable TSDB."),
)

_ALL = "job, run, attempt"
_BUSY_RANK = (f'sum by ({_ALL}, rank) (argus_phase_seconds{{category="compute"}} '
              f'- argus_phase_wait_seconds{{category="compute"}})')

#: collective group kind → the coordinate labels that identify one group of that kind
_GROUP_KEYS = ((GroupKind.DP, "tp, pp"), (GroupKind.TP, "cp, ep, dp, pp"), (GroupKind.EP, "tp, cp, dp, pp"))


def _group_ratio(kind: str, by: str) -> str:
    inner = f'min by ({_ALL}, phase, {by}) (argus_phase_min_seconds{{category="comm", group="{kind}"}})'
    return f"max by ({_ALL}, phase) ({inner}) / quantile by ({_ALL}, phase) (0.5, {inner})"


#: A processor says it is alive every ``RemoteWriteConfig.heartbeat_s`` (15 s) whether windows
#: flow or not; silent for this long, it is down or its remote write is failing.
PROCESSOR_SILENT_S = 90
#: A job whose ranks are still connected but which finished no step for this long went silent.
JOB_SILENT_S = 300


def watcher_rules(processor_silent_s: float = PROCESSOR_SILENT_S, job_silent_s: float = JOB_SILENT_S) -> tuple[Rule, ...]:
    """Alerts on Argus going blind: they fire on the *absence* of series that should keep
    coming, where every other rule would simply stop having data to compare (a host's processor
    killed, the TSDB write path broken, every rank of a job frozen)."""
    by = "job, run, attempt"
    return (
        Rule("ArgusProcessorSilent", "P1",
             f"time() - max by (job, host) (max_over_time(argus_processor_heartbeat_seconds[1h])) > {processor_silent_s:g}",
             "0m", "the Argus processor on {{ $labels.host }} has not been heard for over "
             f"{processor_silent_s:g} s: down, or its remote write is failing — that host's ranks are unobserved"),
        Rule("ArgusJobSilent", "P0",
             f"(time() - max by ({by}) (max_over_time(argus_run_last_step_seconds[1h])) > {job_silent_s:g}) "
             f"and on ({by}) (max by ({by}) (last_over_time(argus_run_ranks_connected[2m])) > 0)",
             "0m", "{{ $labels.run }}: its ranks are connected but none finished a step for over "
             f"{job_silent_s:g} s — every rank went silent"),
    )


RULES: tuple[Rule, ...] = (
    Rule("ArgusStepNeverFinished", "P0", f'max by ({_ALL}) (argus_step_duration_seconds) == +Inf', "0m",
         "a step of {{ $labels.run }} never finished: the job is hung"),
    Rule("ArgusRankLost", "P0",
         f'count by ({_ALL}) (max by ({_ALL}, rank) (max_over_time(argus_step[15m]))) > '
         f'count by ({_ALL}) (max by ({_ALL}, rank) (max_over_time(argus_step[3m])))', "2m",
         "ranks of {{ $labels.run }} stopped reporting steps while others go on (GPU or host lost)"),
    Rule("ArgusStraggler", "P1",
         f'max by ({_ALL}) ({_BUSY_RANK}) / quantile by ({_ALL}) (0.5, {_BUSY_RANK}) > 1.2', "5m",
         "a rank of {{ $labels.run }} computes {{ $value | humanize }}× the median: a straggler costing >10%"),
    # a group's transfer time is its fastest member's (the others also waited); compare groups,
    # and never call a compute straggler a link (it makes its peers' collectives look slow)
    Rule("ArgusLinkDegraded", "P1",
         "(" + " or ".join(f"({_group_ratio(g, by)} > 1.3)" for g, by in _GROUP_KEYS) + f") unless on ({_ALL}) "
         f'(max by ({_ALL}) ({_BUSY_RANK}) / quantile by ({_ALL}) (0.5, {_BUSY_RANK}) > 1.2)', "10m",
         "{{ $labels.phase }} of {{ $labels.run }}: some groups transfer {{ $value | humanize }}× slower"),
    Rule("ArgusStepTimeRegression", "P2",
         f'quantile by ({_ALL}) (0.5, argus_step_duration_seconds < +Inf) > 1.2 * quantile by ({_ALL}) '
         f'(0.5, min_over_time((argus_step_duration_seconds < +Inf)[1h:1m]))', "10m",
         "{{ $labels.run }}: median step time 20% above its best this hour"),
    Rule("ArgusRecordsDropped", "P2", 'sum by (job, run, attempt, host) (argus_dropped_events) > 0', "0m",
         "processor on {{ $labels.host }} dropped records of {{ $labels.run }}: analysis is partial"),
    # ``argus healthcheck --remote-write``: a node that failed a check, and no check has passed since
    Rule("ArgusNodeOutOfService", "P1", "min by (host) (last_over_time(argus_node_in_service[7d])) == 0", "0m",
         "{{ $labels.host }} failed a health check and none has passed since: keep it out of jobs"),
    *watcher_rules(),
)


def substitute(expr: str, job: str, run: str = ".*", phase: str = ".*") -> str:
    """A panel's PromQL with the dashboard variables filled in (for checking it)."""
    return expr.replace("$job", job).replace("$run", run).replace("$phase", phase)

"""Link degradation: transfers of a minority of groups slower than the rest (L2), communicator
floors shifted (L3), a PCIe link or NIC port down; and the victims of a compute culprit put back."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from argus.analysis.evidence import (EvidenceKind, culprit_dismissed, group_shift, host_pressure, link_errors,
                                     nic_port_down, not_compared, pcie_degraded, transfer_shift, victim_transfers)
from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State, grade
from argus.analysis.rootcause.context import WindowAnalysis, _Ctx, _l1_evidence, _rank_list
from argus.analysis.rootcause.impact import _impact, _spread_pct, _measured_slowdown_pct
from argus.analysis.rootcause.hardware import (_pressure_standing_out, _link_error_hosts, _pcie_steps_by_host,
                                               _nic_down_slow_steps)
from argus.analysis.rootcause.slow_hosts import (_ranks_on_hosts, _host_kernel_time, _host_slow,
                                                 _host_kernel_time_known, _masked_compute)

__all__ = ["reinstate_victims", "MIN_RECURRENCE", "PAIR_PERSISTENCE", "PAIR_MIN_STEPS", "DOMINANT_SHARE",
           "PCIE_COMPARED_SHARE"]


#: A slow link slows the same group's transfers step after step (or flap after flap), while
#: the per-step test's false alarms fall on random groups and steps: a group's finding stands
#: once it recurs in this many steps (or a hardware link signal sits on its hosts). With a
#: per-test false-alarm rate α, a group then raises one by chance at ~C(n, 2)·α² per window of
#: n steps, instead of n·α.
MIN_RECURRENCE = 2


#: Two pipeline lines, one's fastest transfer of a step ≥ 4× the other's (``links.PP_PAIR_FLOOR``):
#: with two values there is no spread to judge by, and on a shared CPU host scheduling alone
#: makes one line's receives 4–22× the other's in a few steps (a healthy 4-rank pipeline on 2
#: vCPUs: 3 of 12 steps). A slow link does it step after step (the throttled netns link: 60 of
#: 60), so such a finding stands only when it holds in this share of the normal steps from its
#: first to its last, and in at least ``PAIR_MIN_STEPS`` of them.
PAIR_PERSISTENCE = 0.8


PAIR_MIN_STEPS = 4


#: An intermittent link finding no second channel confirms (device-timed communicator kernels,
#: the hardware) is claimed from this many slow steps; fewer are shown. On a shared 2-vCPU VM a
#: healthy six-host netns job's data-parallel group on one host read 45–72 ms slow in steps 1 and 2
#: only (CI: a warning at +9.7%); a slow link or a flapping one recurs.
MIN_CLAIMED_LINK_STEPS = 3


#: Findings of one step within this share of its costliest one name the slow transfers;
#: smaller ones (a collective a tenth as long that moves in the noise) neither narrow the hosts
#: nor add culprits.
DOMINANT_SHARE = 0.5


def _links(ctx: _Ctx, windows: list[WindowAnalysis], compute: list[Incident]) -> list[Incident]:
    hw_hosts = {str(ctx.topology.hosts[r]) for r in list(ctx.hw.pcie_degraded) + list(ctx.hw.nic_down)}
    hw_hosts |= set(_link_error_hosts(ctx))  # a port or NVLink counting errors while the job ran

    def backed(hosts_: list[str], narrow_only: bool) -> bool:
        """Like-with-like evidence stands on its own; a two-group or cross-stage comparison
        (stages may move other sizes) only with a hardware link signal on those hosts."""
        return not narrow_only or bool(set(hosts_) & hw_hosts)

    # not in warm-up or checkpoint steps: a communicator's first collective builds it (NCCL
    # connects lazily: one group's first all-to-all far slower than the rest), a save's
    # barrier waits on storage — neither is a link, and a second chance finding would make two
    findings = [lf for w in windows for lf in w.l2.links if ctx.normal(lf.step)]
    seen: dict[tuple[str, tuple[int, ...]], set[int]] = defaultdict(set)
    for lf in findings:
        seen[(lf.group_kind, tuple(lf.ranks))].add(lf.step)
    by_step: dict[int, list] = defaultdict(list)
    for lf in findings:
        if lf.pair_only and not _persistent_pair(ctx, seen[(lf.group_kind, tuple(lf.ranks))]) \
                and not set(lf.hosts) & hw_hosts:
            continue
        if len(seen[(lf.group_kind, tuple(lf.ranks))]) >= MIN_RECURRENCE or set(lf.hosts) & hw_hosts:
            by_step[lf.step].append(lf)
    shifts = [s for w in windows if w.l3 for s in w.l3.shifts]
    # … only on hosts whose transfers were seen slower at least once: an alarm on a host that
    # computes slowly while its transfers are normal is case 5's red herring, never a link
    slow_transfer = {h for fs in by_step.values() for f in fs for h in f.hosts} | {h for s in shifts for h in s.hosts}
    # … or whose compute kernels are normal: when every group crosses the host (all of them
    # shifted alike, nothing to compare), the alarm and the slow steps are the evidence, and
    # normal kernels rule out case 5's slow GPUs
    nic_all = _nic_down_slow_steps(ctx)
    nic_hosts = sorted({h for hs in nic_all.values() for h in hs})
    normal_compute = {h for h in nic_hosts if _host_kernel_time(ctx, windows, _ranks_on_hosts(ctx, [h]),
                                                                sorted(nic_all)) is None
                      and _host_kernel_time_known(windows, _ranks_on_hosts(ctx, [h]))}
    nic_steps = {step: hs & (slow_transfer | normal_compute) for step, hs in nic_all.items()
                 if hs & (slow_transfer | normal_compute)}
    pcie = _pcie_steps_by_host(ctx)
    if not by_step and not shifts and not nic_steps:
        return _pcie_only(ctx, pcie, compute)
    per_step_hosts: dict[int, set[str]] = {}
    for step in list(by_step):
        stands = [f for f in by_step[step] if backed(f.hosts, f.narrow_only)]
        if not stands:
            del by_step[step]  # comparisons that only narrow other findings down
            continue
        top = max(f.extra_per_step_ns for f in stands)
        by_step[step] = [f for f in by_step[step] if f.extra_per_step_ns >= DOMINANT_SHARE * top]
    for step, fs in by_step.items():
        common = set.intersection(*(set(f.hosts) for f in fs))
        per_step_hosts[step] = common or min((set(f.hosts) for f in fs if backed(f.hosts, f.narrow_only)), key=len)
    # window-level communicator floors narrow the hosts the same way (like-with-like ones first:
    # a cross-stage comparison only narrows what another finding names)
    for s in sorted(shifts, key=lambda s: s.narrow_only):
        for step in range(_window_of(windows, s)[0], _window_of(windows, s)[1] + 1):
            if step not in per_step_hosts and not backed(s.hosts, s.narrow_only):
                continue
            per_step_hosts[step] = (per_step_hosts.get(step, set(s.hosts)) & set(s.hosts)) or per_step_hosts.get(
                step, set(s.hosts))
    # a NIC port reported down in a step that is slower than the job's healthy level: the
    # hardware and the step time agree on the host, even where every group crossing it (two
    # hosts: all of them) is shifted alike and no comparison of groups can tell
    for step, hs in nic_steps.items():
        per_step_hosts[step] = (per_step_hosts[step] & hs) or hs if step in per_step_hosts else set(hs)
    counts = Counter(h for hs in per_step_hosts.values() for h in hs)
    if not counts:
        return _pcie_only(ctx, pcie, compute)
    n_steps = len(per_step_hosts)
    hosts = _alone(sorted(h for h, c in counts.items() if c >= 0.5 * n_steps), by_step, shifts)
    if hw_hosts & set(hosts):
        # the hardware names the hosts: those the comparisons agree on, and every other host
        # whose PCIe link is down at the same time (noise picks one of two slow hosts per step)
        hosts = sorted(hw_hosts & set(hosts) | set(pcie))
    steps = sorted(s for s, hs in per_step_hosts.items() if hs & set(hosts))
    if not hosts or not steps:
        return _pcie_only(ctx, pcie, compute)
    # a link the hardware reports trained down is slow in every step it does so, whether or
    # not a comparison of that step stood out: those steps are the incident's, never a clean
    # baseline to measure its cost against
    down_steps = {s_ for h in hosts for s_ in pcie.get(h, ()) if s_ in ctx.step_time and ctx.normal(s_)}
    if down_steps and len(set(steps) & down_steps) < PCIE_COMPARED_SHARE * len(down_steps):
        # comparisons stood out in a few of the steps the hardware reports the link down in:
        # they measure noise, not the link (every group it slows crosses the slow hosts)
        return _pcie_only(ctx, pcie, compute)
    steps = sorted(set(steps) | {s_ for h in hosts for s_ in pcie.get(h, ()) if s_ in ctx.step_time})
    # what names the slow transfers: findings that stand (narrowing-only ones picked the hosts)
    standing = {s_: [f for f in fs if backed(f.hosts, f.narrow_only)] for s_, fs in by_step.items()}
    # Case 5: a NIC alarm pins slow steps to hosts whose compute kernels take far longer than
    # their peers' while their measured transfers explain little of the loss — the network is
    # the red herring; the hosts' GPUs are slow (even where the host holds half a peer set and
    # no per-rank test can single its ranks out)
    masking = [inc for inc in compute if inc.severity != "info" and set(inc.hosts) & set(hosts)
               and inc.start_step <= steps[-1] and inc.end_step >= steps[0]]
    own: set[int] = set()
    slow_compute = _host_slow(ctx, windows, _ranks_on_hosts(ctx, hosts), steps, own)
    if slow_compute is not None and any(nic_steps.get(s_, set()) & set(hosts) for s_ in steps):
        lost = _impact(ctx, steps)[2] / max(sum(1 for s_ in steps if ctx.normal(s_)), 1)
        explained = max((f.extra_per_step_ns for s_ in steps for f in standing.get(s_, [])
                         if set(f.hosts) & set(hosts)), default=0.0) / 1e9
        if explained < 0.5 * lost:
            # the hosts named slow already (``_slow_hosts``) are that incident, not a second one
            named = {r for inc in masking for r in inc.culprit_ranks}
            return [] if set(slow_compute) <= named else [
                _masked_compute(ctx, hosts, steps, slow_compute, explained, lost, own)]
    # A compute culprit on these hosts explains the waits (``masking``): never call it a link.
    # Transfers measured slow there too cannot be told apart from it: shown, as inconclusive,
    # not claimed.
    ranks = _slow_link_ranks(ctx, standing, steps, hosts, [s_ for s_ in shifts if not s_.narrow_only])
    # each step loses at least what the slow link added to the costliest collective's transfers:
    # a per-step transfer finding's, or a window's shifted communicator floor × its launches per
    # step (a link slow from the first step slows all-to-alls launched 64 times a step, which no
    # per-step comparison of one phase sees whole)
    floor_cost = _shift_cost_per_step(windows, [s_ for s_ in shifts if backed(s_.hosts, s_.narrow_only)], hosts)
    extra = [max(max((f.extra_per_step_ns for f in standing.get(s, []) if set(f.hosts) & set(hosts)), default=0.0),
                 floor_cost.get(s, 0.0)) / 1e9 for s in steps if s in standing or s in floor_cost]
    # a second channel: the device-timed kernels of a communicator of a kind the phases named
    # slow on these hosts (a comparison that only narrows cannot stand alone, but it can agree)
    named_kinds = {f.group_kind for fs in standing.values() for f in fs if set(f.hosts) & set(hosts)}
    l3_agrees = any(set(s.hosts) & set(hosts) and (not s.narrow_only or s.group_kind in named_kinds) for s in shifts)
    hw_agrees = bool(hw_hosts & set(hosts))
    persistent = len(steps) >= 0.8 * len(ctx.step_time) - 2
    # confirmed only where a second channel agrees (device-timed communicator kernels, the
    # hardware): steps that recur in the host-timed phases alone are one channel, and a healthy
    # CPU job's pipeline receives on a shared core recurred in 3 steps (a cordon for nothing)
    confirmed = len(steps) >= 2 and (l3_agrees or hw_agrees)
    down = [s_ for s_ in steps if nic_steps.get(s_, set()) & set(hosts)]
    if len(down) >= 0.5 * len(steps):  # the alarm pins the slow steps: what they lost is the link's
        pct, gpuh, _ = _impact(ctx, steps)
    else:
        pct, gpuh, _ = _impact(ctx, steps, float(np.median(extra)) if extra else None)
        measured = _measured_slowdown_pct(ctx, steps)
        if measured is not None and measured < pct:  # slow transfers off the critical path cost less
            gpuh *= measured / pct if pct > 0 else 0.0
            pct = measured
        if not persistent:
            pct = _spread_pct(ctx, steps, pct)
    collectives = Counter(f.collective for s in steps for f in standing.get(s, []))
    kernels = sorted({s.kernel for s in shifts if set(s.hosts) & set(hosts)}) or sorted(collectives)
    evidence = _l1_evidence(ctx, steps[0], steps[-1])
    for step in steps[:3]:
        evidence += [transfer_shift(f) for f in by_step.get(step, [])[:3]]
    evidence += [group_shift(s) for s in shifts[:4]]
    for r in sorted(ctx.hw.pcie_degraded)[:8]:
        if str(ctx.topology.hosts[r]) in hosts:
            gen, width = ctx.hw.pcie_degraded[r]
            evidence.append(pcie_degraded(r, gen, width))
    nic = sorted(r for r in ctx.hw.nic_down if str(ctx.topology.hosts[r]) in hosts)
    if nic:
        evidence.append(nic_port_down(nic[:8]))
    errors = {h: n for h, n in _link_error_hosts(ctx, steps[0], steps[-1]).items() if h in hosts}
    if errors:
        evidence.append(link_errors(sorted(errors), {h: int(n) for h, n in sorted(errors.items())},
                                    "InfiniBand port or NVLink error counters rose on these hosts during the slow "
                                    "steps"))
    # … and the host's CPUs: a link that looks slow on the one host whose CPUs were saturated
    # (packet processing, other tenants) is as likely contention as a link: never confirmed so
    contended = _pressure_standing_out(ctx, ctx.hw.cpu_pressure, hosts, steps[0], steps[-1])
    if contended:
        confirmed = False
        evidence.append(host_pressure(EvidenceKind.CPU_PRESSURE, sorted(contended),
                                      {h: round(v, 1) for h, (v, _) in sorted(contended.items())},
                                      round(next(iter(contended.values()))[1], 1),
                                      "CPU pressure (PSI, softirq, steal) on these hosts only, during the slow steps"))
    first = min((s_ for s_ in ctx.step_time if ctx.normal(s_)), default=0)
    pattern = (("from the first step" if steps[0] <= first else f"from step {steps[0]} on") if persistent
               else f"in {len(steps)} step{'s' * (len(steps) > 1)} (intermittent)")
    slow_groups = {(f.group_kind, tuple(f.ranks)) for s in steps for f in standing.get(s, [])}
    groups = sorted({kind for kind, _ in slow_groups})
    where = (f"the {'/'.join(groups)} group{'s' * (len(slow_groups) > 1)} of rank{'s' * (len(ranks) > 1)} "
             f"{_rank_list(ranks)} on {', '.join(hosts)}" if groups else f"collectives crossing {', '.join(hosts)}")
    summary = (f"{where} transfer slowly {pattern}: "
               f"{', '.join(c for c, _ in collectives.most_common(3)) or ', '.join(kernels)}; compute is normal")
    if errors:
        summary += f"; link error counters rose on {', '.join(sorted(errors))}"
    if contended:
        h, (v, base) = sorted(contended.items())[0]
        summary += (f"; {h}'s CPUs were under pressure meanwhile ({v:.0f}% vs {base:.0f}% on the other hosts): "
                    f"contention is as likely as the link")
    # … and so does one among the slow groups' own members, wherever its host: a group waits for
    # its slowest member, and a member that computes slowly cannot be told from the link it
    # crosses (held-out 69222: a host's mlp ×2 named, and the data-parallel groups its ranks
    # share with the next host's were a confirmed link there, with cordon_node)
    members = {r for s_ in steps for f in standing.get(s_, []) if set(f.hosts) & set(hosts) for r in f.ranks}
    members |= {r for sh in shifts if set(sh.hosts) & set(hosts) for r in sh.ranks}
    masking += [inc for inc in compute if inc not in masking and inc.severity != "info"
                and set(inc.culprit_ranks) & members and inc.start_step <= steps[-1] and inc.end_step >= steps[0]]
    severity = grade(pct)
    if not persistent and not confirmed and not down and len(steps) < MIN_CLAIMED_LINK_STEPS:
        severity = Severity.INFO
        summary += (f"; in {len(steps)} step{'s' * (len(steps) > 1)} only, and no second channel saw it: shown, "
                    "not claimed")
    link = Incident(IncidentClass.LINK_DEGRADATION, ranks, hosts, ctx.gpus_of(ranks), steps[0], steps[-1],
                    next(iter(collectives), "collectives"), kernels, State.CONFIRMED if confirmed else State.SUSPECTED,
                    severity, pct, gpuh, Action.CORDON_NODE if confirmed else Action.VERIFY,
                    evidence, steps, summary)
    if masking:
        # culprit over victim: the compute culprit explains the waits, so the slow-looking
        # transfers are its victims' evidence, in its incident — never an incident of their own
        # (unless the replay later finds the culprit costs nothing: ``reinstate_victims``)
        culprit = masking[0]
        culprit.evidence.append(victim_transfers(
            hosts, ranks[:64], steps[:32], [c for c, _ in collectives.most_common(3)] or kernels[:3],
            "transfers on these hosts look slow while their ranks compute slowly: the others wait for them there; "
            "no link is blamed"))
        culprit.victims.append(link)
        return []
    return [link]


def reinstate_victims(incidents: list[Incident]) -> list[Incident]:
    """Incidents held back as a compute culprit's victims, put back where that culprit no longer
    explains anything: L4's replay found removing its excess gains the job nothing (graded
    ``info``). Masking is decided before the replay; without this a throttled link vanished
    behind a pipeline "culprit" the replay then dismissed, and the job's 30% loss had no incident."""
    out = list(incidents)
    for inc in incidents:
        if not inc.victims or inc.severity != Severity.INFO:
            continue
        for victim in inc.victims:
            victim.evidence.append(culprit_dismissed(
                inc.id, inc.culprit_ranks[:16],
                f"taken at first for the waits of rank(s) {_rank_list(inc.culprit_ranks)} ({inc.klass}); "
                "replayed without their excess the job gains nothing, so the slow transfers stand on their own"))
            out.append(victim)
        inc.evidence = [e for e in inc.evidence if e.get("kind") != EvidenceKind.VICTIM_TRANSFERS]
        inc.victims = []
    return out


#: A link the hardware reports down is measured by transfer comparisons only when they stood
#: out in at least this share of the steps it was down in.
PCIE_COMPARED_SHARE = 0.25


def _pcie_only(ctx: _Ctx, pcie: dict[str, set[int]], compute: list[Incident]) -> list[Incident]:
    """PCIe links reported trained down where no comparison of transfers could stand: every
    group those ranks' transfers cross runs through the slow hosts (two of three hosts), so
    there is no healthy group of the same kind to compare with. The hardware names the hosts;
    the cost is measured only if the job ran clean steps before the link went down — else it
    is stated as not measurable (never inferred), the incident a warning to verify (an
    active link check), not a confirmed cordon."""
    steps = sorted({s for ss in pcie.values() for s in ss if s in ctx.step_time})
    if not pcie or not steps:
        return []
    hosts = sorted(pcie)
    ranks = sorted(int(r) for r in ctx.hw.pcie_degraded if str(ctx.topology.hosts[r]) in hosts)
    if any(inc.severity != Severity.INFO and set(inc.hosts) & set(hosts) for inc in compute):
        return []  # a compute culprit there explains the job's waits
    measured = _measured_slowdown_pct(ctx, steps)
    n_normal = sum(1 for s_ in steps if ctx.normal(s_))
    gpuh = None if measured is None else ctx.world * measured / 100.0 * ctx.l1.baseline_s * n_normal / 3600.0
    severity = grade(measured) if measured is not None else Severity.WARNING
    evidence = [pcie_degraded(r, ctx.hw.pcie_degraded[r][0], ctx.hw.pcie_degraded[r][1]) for r in ranks[:8]]
    evidence.append(not_compared("no group of the same kind runs clear of these hosts: transfers cannot be compared "
                                 "like with like" + ("" if measured is not None else
                                                     "; no clean step before the link went down: the cost is not "
                                                     "measurable from this job")))
    first = min((s_ for s_ in ctx.step_time if ctx.normal(s_)), default=0)
    when = "from the first step" if steps[0] <= first else f"from step {steps[0]} on"
    gen, width = ctx.hw.pcie_degraded[ranks[0]]
    summary = (f"PCIe links of {len(ranks)} rank{'s' * (len(ranks) > 1)} ({_rank_list(ranks)}) on {', '.join(hosts)} "
               f"run below their maximum (Gen{gen:g} x{width:g}) {when}; every group their transfers belong to "
               "crosses these hosts, so no comparison of transfers can single them out; "
               + ("no clean step before it: the cost is not measurable from this job" if measured is None else
                  f"the job ran {measured:.1f}% slower than before") + " — verify the links")
    return [Incident(IncidentClass.LINK_DEGRADATION, ranks, hosts, ctx.gpus_of(ranks), steps[0], steps[-1],
                     "collectives", [], State.SUSPECTED, severity, measured, gpuh, Action.VERIFY, evidence, steps, summary)]


def _alone(hosts: list[str], by_step: dict[int, list], shifts: list) -> list[str]:
    """Of several hosts every slow step names together (the two ends of one pipeline pair), those
    whose transfers were also seen slow in a group holding none of the others: host 4's link
    throttled slows its sends to host 1 and its own data-parallel reduction with hosts 3 and 5,
    while host 1's reduction with hosts 0 and 2 stays normal — host 1 is the pair's victim. Where
    none or all are seen alone (a link between exactly those hosts), all stay."""
    if len(hosts) < 2:
        return hosts
    groups = [set(f.hosts) for fs in by_step.values() for f in fs] + [set(s.hosts) for s in shifts]
    alone = [h for h in hosts if any(h in g and not g & (set(hosts) - {h}) for g in groups)]
    return alone if alone else hosts


def _persistent_pair(ctx: _Ctx, flagged: set[int]) -> bool:
    """Did a two-line pipeline finding hold step after step (``PAIR_PERSISTENCE``)?"""
    normal = [s for s in ctx.step_time if ctx.normal(s) and min(flagged) <= s <= max(flagged)]
    hits = sum(1 for s in normal if s in flagged)
    return hits >= PAIR_MIN_STEPS and hits >= PAIR_PERSISTENCE * len(normal)


def _shift_cost_per_step(windows: list[WindowAnalysis], shifts: list, hosts: list[str]) -> dict[int, float]:
    """Step → the costliest shifted floor on ``hosts`` in its window: the floor's extra ns per
    event × the kernel's events per rank-step (a lower bound of what the step lost: transfers
    of other kernels may add to it, overlap with compute may hide some)."""
    out: dict[int, float] = {}
    for w in windows:
        if w.l3 is None:
            continue
        for sh in w.l3.shifts:
            if sh in shifts and set(sh.hosts) & set(hosts):
                cost = sh.extra_ns_per_event * w.l3.events_per_step.get((sh.kernel, sh.stream), 0.0)
                for step in range(w.lo, w.hi + 1):
                    out[step] = max(out.get(step, 0.0), cost)
    return out


def _slow_link_ranks(ctx: _Ctx, by_step: dict[int, list], steps: list[int], hosts: list[str],
                     shifts: list | None = None) -> list[int]:
    """The ranks whose transfers are slow: members of the shifted groups on the culprit hosts
    in at least half the steps that saw them (else of the window-level communicator floors
    that shifted, ``shifts``), plus ranks whose PCIe or NIC the hardware flags there. A slow
    group's ranks, not every rank of its hosts or stage; a whole host's ranks only when
    nothing narrower was seen (a NIC alarm alone)."""
    on_hosts = np.isin(ctx.topology.hosts.astype(str), hosts)
    seen: Counter[int] = Counter()
    n = 0
    for s in steps:
        fs = [f for f in by_step.get(s, []) if set(f.hosts) & set(hosts)]
        if fs:
            n += 1
            seen.update({r for f in fs for r in f.ranks if on_hosts[r]})
    ranks = {r for r, c in seen.items() if c >= 0.5 * n}
    if not ranks:
        ranks = {int(r) for sh in shifts or [] if set(sh.hosts) & set(hosts) for r in sh.ranks if on_hosts[r]}
    ranks |= {int(r) for r in list(ctx.hw.pcie_degraded) + list(ctx.hw.nic_down) if on_hosts[r]}
    return sorted(ranks) or sorted(int(r) for r in np.flatnonzero(on_hosts))


def _window_of(windows: list[WindowAnalysis], shift) -> tuple[int, int]:
    for w in windows:
        if w.l3 is not None and shift in w.l3.shifts:
            return w.lo, w.hi
    return 0, -1

"""Collective instances: the same collective call matched across the members of its group.

A member's phase belongs to instance (name, step, microbatch, group kind, group, occurrence)
where *occurrence* counts that collective within the rank's (step, microbatch) in start
order. From instances follow two facts the detectors need, both on each rank's own clock:

* the **transfer time** of an instance is its shortest member duration — all members end
  together and the last to arrive waits for no one;
* a member's **gap** is the time since its own previous collective ended (its work and host
  time); the member whose gap is longest is the one the group waited for.

Pipeline sends and receives are paired the same way (``pair_p2p``): a receive waits for its
sender's compute as well as for the wire, so its **transfer** is its end minus the later of
the two posts, on clocks aligned by the collectives — never the receive's own duration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.analysis.frames import PhaseFrame
from argus.topology import GROUP_KINDS, Layout
from argus.vocab import GroupKind
from argus.uniques import sorted_unique

__all__ = ["Instances", "match_instances", "host_clock_offsets", "aligned_starts", "pair_p2p", "P2PTransfers",
           "p2p_transfers"]

#: The collective kinds matched into instances; pipeline p2p last, so it can be left out.
_KINDS = (GroupKind.TP, GroupKind.CP, GroupKind.EP, GroupKind.DP, GroupKind.EDP, GroupKind.WORLD, GroupKind.PP)


@dataclass
class Instances:
    rows: np.ndarray  # phase-frame row of each member
    inv: np.ndarray  # instance index of each member
    size: np.ndarray  # members per instance
    name: np.ndarray  # per instance: phase-name id
    kind: str | None
    kinds: np.ndarray  # per instance: group kind (index into _KINDS)
    group: np.ndarray  # per instance: group index within its kind
    step_i: np.ndarray  # per instance: step index
    transfer_ns: np.ndarray  # per instance: shortest member duration
    gap_ns: np.ndarray  # per member: time since its previous collective ended (nan if none)

    @staticmethod
    def kind_name(code: int) -> str:
        return _KINDS[code]


def group_keys(layout: Layout, kind: str, ranks: np.ndarray) -> np.ndarray | None:
    """Each rank's communicator of ``kind`` (a key equal for the members of one group), or None
    for a kind whose groups the layout cannot name."""
    if kind in GROUP_KINDS:
        return layout.group_index(kind)[ranks]
    co = layout.coords(ranks)
    st = layout.strides
    if kind == "model_parallel":  # tp × pp: same cp, ep, dp
        return ranks - co["tp"] * st["tp"] - co["pp"] * st["pp"]
    if kind == "embedding" and layout.pp > 1:  # first and last stage of one pipeline line
        return layout.group_index(GroupKind.PP)[ranks]
    return None


def _prev_comm_end(f: PhaseFrame) -> np.ndarray:
    """For each comm row: the end of the same rank's previous finished comm phase (nan if none)."""
    out = np.full(f.n, np.nan)
    c = np.flatnonzero(f.is_comm & (f.dur >= 0))
    if c.size == 0:
        return out
    end = (f.start[c] + f.dur[c]).astype(np.float64)
    rank = f.rank[c]
    new_rank = np.ones(c.size, bool)
    new_rank[1:] = rank[1:] != rank[:-1]
    # running max of ends within each rank's run (rows are in (rank, start) order)
    seg = np.cumsum(new_rank)
    lift = (np.abs(end).max() * 2 + 1) * seg
    running = np.maximum.accumulate(end + lift) - lift
    prev = np.concatenate([[np.nan], running[:-1]])
    out[c] = np.where(new_rank, np.nan, prev)
    return out


def match_instances(f: PhaseFrame, layout: Layout, step_i: np.ndarray, with_pp: bool = False,
                    named: bool = False) -> Instances | None:
    """Group finished collective phases into instances (pipeline p2p only if ``with_pp``; with
    ``named``, also communicators of kinds the layout does not list but can name, as Megatron's
    model-parallel group: their kind codes then lie past ``_KINDS``)."""
    kinds_ok: list[str] = list(_KINDS if with_pp else _KINDS[:-1])
    if named:
        kinds_ok += [g for g in f.groups if g not in _KINDS and g not in kinds_ok
                     and group_keys(layout, g, np.zeros(1, np.int64)) is not None]
    code = np.array([kinds_ok.index(g) if g in kinds_ok else -1 for g in f.groups], np.int64)
    if code.size == 0:
        return None
    sel = f.is_comm & (f.dur >= 0) & (code[f.group] >= 0)
    rows = np.flatnonzero(sel)
    if rows.size == 0:
        return None
    rank, name = f.rank[rows], f.name[rows].astype(np.int64)
    mb = f.mb[rows].astype(np.int64) + 1
    si = step_i[rows].astype(np.int64)
    kind = code[f.group[rows]]
    gidx = np.zeros(rows.size, np.int64)
    for k in sorted_unique(kind):
        m = kind == k
        keys = group_keys(layout, kinds_ok[k], rank[m])
        assert keys is not None  # only kinds it names were kept
        gidx[m] = keys
    n_mb, n_names, S = int(mb.max()) + 1, len(f.names), int(si.max()) + 1
    occ_key = ((rank * S + si) * n_mb + mb) * n_names + name
    order = np.argsort(occ_key, kind="stable")  # rows are already in (rank, start) order
    run_start = np.ones(rows.size, bool)
    run_start[1:] = occ_key[order][1:] != occ_key[order][:-1]
    pos = np.arange(rows.size) - np.maximum.accumulate(np.where(run_start, np.arange(rows.size), 0))
    seq = np.empty(rows.size, np.int64)
    seq[order] = pos
    key = ((((name * S + si) * n_mb + mb) * len(kinds_ok) + kind) * (layout.world_size + 1) + gidx) \
        * (int(seq.max()) + 1) + seq
    uniq, inv = np.unique(key, return_inverse=True)
    size = np.bincount(inv, minlength=len(uniq))
    first = np.full(len(uniq), rows.size, np.int64)
    np.minimum.at(first, inv, np.arange(rows.size))
    transfer = np.full(len(uniq), np.inf)
    np.minimum.at(transfer, inv, f.dur[rows].astype(np.float64))
    gap = f.start[rows] - _prev_comm_end(f)[rows]
    gap = np.where(np.isfinite(gap) & (gap >= 0), gap, np.nan)
    return Instances(rows, inv, size, name[first], None, kind[first], gidx[first], si[first], transfer, gap)


def host_clock_offsets(f: PhaseFrame, inst: Instances, hosts: np.ndarray) -> dict[str, float]:
    """Per-host clock offsets (ns, median zero): members of an instance end at the same true time.

    Each instance that spans hosts gives, for every host in it, its members' mean end against
    the instance's first host's; a pair of hosts' offset difference is the median over the
    instances they share, and the offsets are the least-squares fit of every pair's (weighted by
    how many instances it rests on). Hosts linked only through a few instances are aligned by
    them: Megatron's first-stage and second-stage hosts share one model-parallel all-reduce a
    step and thousands of data-parallel ones within each side, and a median against each
    instance's mean left the two sides 5 ms apart (a receive then "ended" before its send began)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import spsolve

    rows = inst.rows
    host_ids, host_of_rank = np.unique(np.asarray(hosts).astype(str), return_inverse=True)
    H = len(host_ids)
    zero = {str(h): 0.0 for h in host_ids}
    if H < 2 or rows.size == 0:
        return zero
    end = (f.start[rows] + f.dur[rows]).astype(np.float64)
    # per (instance, host): its members' mean end there
    key = inst.inv.astype(np.int64) * H + host_of_rank[f.rank[rows]]
    keys, kinv = np.unique(key, return_inverse=True)
    hend = np.bincount(kinv, weights=end) / np.bincount(kinv)
    k_inst, k_host = keys // H, keys % H
    first = np.r_[True, k_inst[1:] != k_inst[:-1]]  # each instance's first host: its pivot
    pivot = np.maximum.accumulate(np.where(first, np.arange(keys.size), 0))
    other = ~first
    if not other.any():  # no instance spans two hosts (a store holding part of a job): nothing to align by
        return zero
    pa, pb = k_host[pivot][other], k_host[other]
    diff = (hend - hend[pivot])[other]  # o_b − o_a
    pk = pa * H + pb
    order = np.lexsort((diff, pk))
    pk, diff = pk[order], diff[order]
    starts = np.flatnonzero(np.r_[True, pk[1:] != pk[:-1]])
    counts = np.diff(np.r_[starts, pk.size])
    med = 0.5 * (diff[starts + (counts - 1) // 2] + diff[starts + counts // 2])
    a, b = pk[starts] // H, pk[starts] % H
    w = np.sqrt(counts.astype(np.float64))
    # weighted normal equations of Σ w (o_b − o_a − med)², a tiny pull to 0 fixing each
    # connected set of hosts (a host in no shared instance keeps 0)
    lap = coo_matrix((np.r_[w, w, -w, -w], (np.r_[a, b, a, b], np.r_[a, b, b, a])), shape=(H, H)).tocsc()
    ridge = 1e-9 * float(w.mean())
    rhs = np.bincount(b, weights=w * med, minlength=H) - np.bincount(a, weights=w * med, minlength=H)
    offset = spsolve((lap + ridge * coo_matrix((np.ones(H), (np.arange(H), np.arange(H))), shape=(H, H))).tocsc(),
                     rhs)
    offset = np.asarray(offset, np.float64)
    offset -= np.median(offset)
    return {str(host_ids[i]): float(offset[i]) for i in range(H)}


def aligned_starts(f: PhaseFrame, layout: Layout, hosts: np.ndarray) -> np.ndarray:
    """Phase starts (ns) on one clock: each host's offset, from the collectives' common ends, removed."""
    inst = match_instances(f, layout, np.zeros(f.n, np.int64))
    offsets = host_clock_offsets(f, inst, hosts) if inst is not None else {}
    off_rank = np.array([offsets.get(str(h), 0.0) for h in np.asarray(hosts).astype(str)])
    return f.start.astype(np.float64) - off_rank[f.rank]


def pair_p2p(f: PhaseFrame, layout: Layout, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pipeline receives paired with their sends: (receive rows, send rows) of the frame.

    A receive followed by a forward block carries activations from stage *s − 1*, one followed
    by a backward block gradients from *s + 1*; a send carries what the block before it made.
    The n-th receive of a (pipeline line, step, microbatch when recorded, direction) is paired
    with the n-th send; stages wrap around (interleaved 1F1B: the last stage sends chunk 0's
    activations to the first stage's chunk 1). Empty without backward blocks (no way to tell activations from
    gradients)."""
    empty = np.zeros(0, np.int64), np.zeros(0, np.int64)
    if layout.pp < 2 or GroupKind.PP not in f.groups:
        return empty
    pp = f.groups.index(GroupKind.PP)
    rows = np.flatnonzero(f.is_comm & (f.dur >= 0) & (f.group == pp))
    if rows.size == 0:
        return empty
    lname = [n.lower() for n in f.names]
    is_recv = np.array(["recv" in n for n in lname])[f.name[rows]]
    is_send = np.array(["send" in n for n in lname])[f.name[rows]]
    fwd_name = np.array(["forward" in n for n in lname])
    bwd_name = np.array(["backward" in n or n.endswith("-bwd") for n in lname])
    # the rank's forward/backward blocks in time order: a receive carries what the next block
    # needs (activations before a forward), a send what the last block made
    work = np.flatnonzero(~f.is_comm & (f.mb >= 0) & (fwd_name | bwd_name)[f.name])
    if not bwd_name[f.name[work]].any():
        return empty
    t0 = float(np.min(start))
    wkey = f.rank[work].astype(np.float64) * 1e15 + (start[work] - t0)
    order = np.argsort(wkey, kind="stable")
    wkey, work = wkey[order], work[order]
    ckey = f.rank[rows].astype(np.float64) * 1e15 + (start[rows] - t0)
    nxt = np.searchsorted(wkey, ckey - 1.0, side="left")  # a block starting at the post's instant is next
    # … and a block starting at a send's instant is the next one, computed while the send is in
    # flight (1F1B: the forward of microbatch m + k starts as the backward of m posts its gradients)
    prv = np.searchsorted(wkey, ckey, side="left") - 1
    ok_n = (nxt < work.size) & (f.rank[work[np.minimum(nxt, work.size - 1)]] == f.rank[rows])
    ok_p = (prv >= 0) & (f.rank[work[np.maximum(prv, 0)]] == f.rank[rows])
    recv_fwd = ~bwd_name[f.name[work[np.minimum(nxt, work.size - 1)]]]
    send_fwd = ~bwd_name[f.name[work[np.maximum(prv, 0)]]]
    stage = layout.stage_of(f.rank[rows])
    line = layout.group_index(GroupKind.PP)[f.rank[rows]]
    sends: dict[tuple, list[int]] = {}
    recvs: dict[tuple, list[int]] = {}
    for j, i in enumerate(rows):  # rows are in (rank, start) order: the n-th of a key is the n-th sent
        step, mb = int(f.step[i]), int(f.mb[i])
        if is_recv[j] and ok_n[j]:
            fwd = bool(recv_fwd[j])
            # modulo pp: the interleaved schedule's last stage feeds the first stage's next chunk
            # (and its gradients flow back the same way)
            src = (int(stage[j]) + (-1 if fwd else 1)) % layout.pp
            recvs.setdefault((int(line[j]), step, mb, fwd, src), []).append(int(i))
        elif is_send[j] and ok_p[j]:
            sends.setdefault((int(line[j]), step, mb, bool(send_fwd[j]), int(stage[j])), []).append(int(i))
    r_out: list[int] = []
    s_out: list[int] = []
    for key, rs in recvs.items():
        ss = sends.get(key, [])
        r_out += rs[:len(ss)]
        s_out += ss[:len(rs)]
    return np.array(r_out, np.int64), np.array(s_out, np.int64)


@dataclass
class P2PTransfers:
    """Per receiving (rank, step): the shortest paired pipeline transfer and how many there were."""

    rank: np.ndarray
    step: np.ndarray
    min_ns: np.ndarray
    sum_ns: np.ndarray
    count: np.ndarray


def p2p_transfers(f: PhaseFrame, layout: Layout, hosts: np.ndarray) -> P2PTransfers | None:
    """Pipeline transfer times (receive end minus the later post), or None when the frame has
    no pairs (no pipeline, or receives that cannot be told apart). The receiving thread's
    run-queue delay inside the receive (``wait_ns``) is not subtracted: delay before the data
    came does not move the end, and the two cannot be told apart (subtracting it hid a
    throttled link in 10 of 25 steps of the namespace job).

    Stages share no collective, so their hosts' clocks cannot be aligned by collective ends;
    each pair of hosts is aligned from its own traffic instead, as NTP does: activations go
    one way and gradients the other, and the shortest send-post-to-receive-end in each
    direction is the transfer plus or minus the clock offset, so half their difference is
    the offset."""
    start = f.start.astype(np.float64)
    recv, send = pair_p2p(f, layout, start)  # direction needs only each rank's own clock
    if recv.size == 0:
        return None
    host_ids, host_of = np.unique(np.asarray(hosts).astype(str), return_inverse=True)
    hr, hs = host_of[f.rank[recv]], host_of[f.rank[send]]
    end = start[recv] + f.dur[recv]
    one_way = end - start[send]  # transfer (+ any wait for the receiver) + clock(receiver) − clock(sender)
    H = len(host_ids)
    flat = np.full(H * H, np.inf)
    np.minimum.at(flat, hs * H + hr, one_way)
    d = flat.reshape(H, H)  # d[a, b]: shortest from a sender on host a to a receiver on host b
    both = np.isfinite(d) & np.isfinite(d.T)
    theta = np.zeros((H, H))
    theta[both] = 0.5 * (d[both] - d.T[both])  # clock(b) − clock(a)
    theta[np.arange(H), np.arange(H)] = 0.0
    send_post = start[send] + theta[hs, hr]  # on the receiver's clock
    xfer = np.maximum(end - np.maximum(start[recv], send_post), 0.0)
    n = int(f.step[recv].max()) + 1
    key = f.rank[recv].astype(np.int64) * n + f.step[recv]
    uniq, inv = np.unique(key, return_inverse=True)
    mn = np.full(len(uniq), np.inf)
    np.minimum.at(mn, inv, xfer)
    return P2PTransfers(uniq // n, uniq % n, mn, np.bincount(inv, weights=xfer, minlength=len(uniq)),
                        np.bincount(inv, minlength=len(uniq)))

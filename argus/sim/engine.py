"""The timing engine: synchronous LLM training on N ranks, vectorised over ranks.

State is one clock per rank, held as a ``(pp, C)`` array: row = pipeline stage, column =
the ranks that share every coordinate but the stage (column ``j`` of stage ``s`` sends to
column ``j`` of stage ``s+1``). Every operation updates one stage row at once; Python loops
run over operations (a few thousand per step), never over events or ranks.

Timing semantics (the ones every detector relies on):

* a collective ends for all members at the same time, the last arrival plus the transfer
  time, so a late member's kernel is *short* and its peers' kernels are long;
* a stage cannot start a microbatch before its input arrives (1F1B schedule), so a slow
  stage opens bubbles downstream (forward) and upstream (backward);
* step ends align because of the global grad-norm all-reduce before the optimizer;
* a host stall delays kernel launches: the phase gets longer while the GPU idles.

Times are float64 ns on one true clock; ``inf`` means "never" (a hang propagates through
``max``). Per-host clock offsets are added only when records are materialised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from argus.sim.config import SimConfig
from argus.sim.faults import FaultPlan, HostStall
from argus.sim.records import NameTable, StepRecords
from argus.sim.schedule import dependency_order
from argus.sim import stacks as stack_model
from argus.sim import telemetry
from argus.sim.workload import STREAMS, CommOp, ComputeOp
from argus.topology import Topology
from argus.vocab import GroupKind, KernelKind, PhaseCategory

__all__ = ["Engine"]

_US = 1_000.0
_MS = 1_000_000.0
#: Arbitrary epoch so timestamps look like real CLOCK_REALTIME nanoseconds.
_EPOCH_NS = 1_764_000_000_000_000_000
#: The group kinds whose collectives run within one stage (pipeline and world ones cross stages).
_SIMULATED_KINDS = (GroupKind.TP, GroupKind.CP, GroupKind.EP, GroupKind.DP)
#: How long a hang is observed before the job is declared dead (NCCL watchdog order).
HANG_OBSERVED_S = 300.0


@dataclass(frozen=True, slots=True)
class _OpArrays:
    base_ns: np.ndarray  # (K,)
    seq_exp: np.ndarray  # (K,)
    moe: np.ndarray  # (K,) bool
    name_ids: np.ndarray  # (K,)
    phase_id: int
    has_moe: bool


class Engine:
    """Runs one simulated job; :meth:`run` yields one :class:`StepRecords` per step."""

    def __init__(self, config: SimConfig, faults: FaultPlan | None = None, emit: bool = True,
                 topology: Topology | None = None):
        self.cfg = config
        self.layout = config.resolve_layout()
        self.topology = topology or Topology.uniform(self.layout, config.hosts_gpus, seed=str(config.seed))
        self.emit = emit
        self.W = config.workload
        n, p = self.layout.world_size, self.layout.pp
        self.N, self.P, self.C, self.M, self.L = n, p, n // p, config.microbatches, config.layers
        self.V = config.virtual_stages  # model chunks per stage (interleaved 1F1B when > 1)
        hosts, self.host_of = np.unique(self.topology.hosts, return_inverse=True)
        self.n_hosts = len(hosts)
        self.faults = faults or FaultPlan(world_size=n, n_hosts=self.n_hosts)
        self.names = NameTable()
        self._build_columns()
        self._build_ops()
        seeds = np.random.SeedSequence(config.seed).spawn(3)
        self.rng = np.random.default_rng(seeds[0])  # natural variance: identical with or without faults
        self.aux_rng = np.random.default_rng(seeds[1])  # stacks and telemetry (only drawn when emitting)
        skew = np.random.default_rng(seeds[2]).uniform(-1, 1, self.n_hosts) * config.clock_skew_ms * _MS
        self.clock_offset_ns = skew[self.host_of]
        self.t = np.zeros((p, self.C))

    # -- static structure ----------------------------------------------------------------
    def _build_columns(self) -> None:
        lay = self.layout
        coords = lay.coords()
        ranks = np.arange(self.N)
        key = ranks - coords["pp"] * lay.strides["pp"]
        self.stage_ranks = np.empty((self.P, self.C), np.int64)
        for s in range(self.P):
            r = np.flatnonzero(coords["pp"] == s)
            self.stage_ranks[s] = r[np.argsort(key[r], kind="stable")]
        col_of = np.empty(self.N, np.int64)
        col_of[self.stage_ranks] = np.arange(self.C)[None, :]
        stage0 = set(self.stage_ranks[0].tolist())
        self.groups: dict[str, np.ndarray] = {}
        self.group_hosts: dict[str, np.ndarray] = {}  # (P, nG, size) host ids
        for kind in _SIMULATED_KINDS:
            table = lay.groups(kind)
            table = table[[row[0] in stage0 for row in table]]
            cols = col_of[table]
            self.groups[kind] = cols
            self.group_hosts[kind] = self.host_of[self.stage_ranks[:, cols]]
        self.group_spans = {k: (h != h[..., :1]).any(-1) for k, h in self.group_hosts.items()}
        hs = self.host_of[self.stage_ranks]  # (P, C)
        self.pp_hosts = np.stack([hs[:-1], hs[1:]], axis=-1) if self.P > 1 else np.zeros((0, self.C, 2), np.int64)
        if self.V > 1 and self.P > 2:  # interleaved: the last stage feeds the first stage's next chunk
            self.pp_hosts = np.concatenate([self.pp_hosts, np.stack([hs[-1], hs[0]], axis=-1)[None]])
        self.pp_spans = self.pp_hosts[..., 0] != self.pp_hosts[..., 1]
        self.local_rank = self.topology.local_ranks[self.stage_ranks].astype(np.int32)
        # Data replica of each column: ranks that share (ep, dp) coordinates see the same samples.
        c0 = lay.coords(self.stage_ranks[0])
        self.replica_of = c0["ep"] + lay.ep * c0["dp"]
        self.n_replicas = lay.ep * lay.dp

    def _build_ops(self) -> None:
        w = self.W
        self.ops: dict[str, _OpArrays] = {}
        for op in w.compute_ops():
            ks = op.kernels
            moe = np.array([k.moe for k in ks])
            self.ops[op.phase] = _OpArrays(
                base_ns=np.array([k.us for k in ks]) * _US,
                seq_exp=np.array([k.seq_exp for k in ks]),
                moe=moe,
                name_ids=np.array([self.names.id(k.name) for k in ks], np.int32),
                phase_id=self.names.id(op.phase),
                has_moe=bool(moe.any()),
            )
        self.id = {s: self.names.id(s) for s in (
            "compute", "comm", "host", "", "kernel", "forward-compute", "backward-compute", "dataloader",
            "checkpoint-save", "pp-send", "pp-recv", "moe_layer", "moe_layer-bwd", "tp", "cp", "ep", "dp",
            "pp", "world", "model_parallel", "embedding")}
        for comm in w.comm_ops():
            self.names.id(comm.phase)
            self.names.id(comm.kernel.name)
        self.block_kernels = {
            (s, b, c): self._count_block_kernels(s, b, c) for s in range(self.P) for b in ("F", "B")
            for c in range(self.V)}

    def _layers(self, c: int) -> range:
        """The stage's layers in model chunk ``c``."""
        per = self.L // self.V
        return range(c * per, (c + 1) * per)

    def _last(self, s: int, c: int) -> bool:
        """Whether (stage, chunk) is the model's last virtual stage (it computes the loss)."""
        return s == self.P - 1 and c == self.V - 1

    def _count_block_kernels(self, s: int, block: str, c: int = 0) -> int:
        w, bwd = self.W, block == "B"
        n = 0
        for layer in self._layers(c):
            n += len((w.attention_bwd if bwd else w.attention_fwd).kernels)
            if w.is_moe(layer, self.layout.ep):
                n += len((w.router_bwd if bwd else w.router_fwd).kernels)
                n += len((w.experts_bwd if bwd else w.experts_fwd).kernels)
            else:
                n += len((w.mlp_bwd if bwd else w.mlp_fwd).kernels)
        if self._last(s, c):
            n += len((w.loss_bwd if bwd else w.loss_fwd).kernels)
        return n

    # -- conversions -----------------------------------------------------------------------
    def per_rank(self, arr: np.ndarray) -> np.ndarray:
        """A ``(P, C)`` array in rank order."""
        out = np.empty(self.N, dtype=arr.dtype)
        out[self.stage_ranks] = arr
        return out

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> Iterator[StepRecords]:
        with np.errstate(invalid="ignore"):
            for step in range(self.cfg.steps):
                rec = self._step(step)
                yield rec
                if not np.isfinite(self.t).any():
                    break  # hung: nothing more happens

    def _step(self, step: int) -> StepRecords:
        cfg, P, C = self.cfg, self.P, self.C
        rec = StepRecords(step=step, names=self.names, clock_offset_ns=self.clock_offset_ns, epoch_ns=_EPOCH_NS)
        self.rec, self.step = rec, step
        self.busy = np.zeros((P, C))
        self.waiting = np.zeros((P, C))
        self.stalled = np.zeros((P, C))
        self.link = self.faults.link_factors(step)
        self.group_link = self._group_link_factors(step)
        self.warm = cfg.warmup_factor(step)
        seq = np.exp(self.rng.standard_normal((self.M, self.n_replicas)) * cfg.seqlen_sigma)
        self.seq = seq[:, self.replica_of]  # (M, C)
        self.tok = np.ones(C)
        self._tok_cache: dict[tuple[int, int, int], np.ndarray] = {}
        self._stall_gap: np.ndarray | None = None
        self._stall_first: np.ndarray | None = None
        step_start = self.t.copy()

        # Host-side data loading, with rare hiccups; a hang never returns from it.
        dl = np.exp(self.rng.standard_normal((P, C)) * 0.3) * self.W.dataloader_ms * _MS
        spikes = self.rng.random((P, C)) < cfg.dataloader_spike_prob
        dl = dl + spikes * self.rng.uniform(20, 80, (P, C)) * _MS
        hang = self.faults.hang_at(step)
        if hang is not None:
            s, c = self._where(hang.rank)
            dl[s, c] = np.inf
        self.dataloader_time = dl
        self.checkpoint_time = np.zeros((P, C))
        for s in range(P):
            self._phase(s, self.id["dataloader"], self.id[PhaseCategory.HOST], self.id[""], -1, self.t[s], dl[s])
        self.t = self.t + dl

        # The pipeline: 1F1B on every stage, executed in an order that respects dependencies.
        self.fwd_out: dict[tuple[int, int], np.ndarray] = {}
        self.bwd_out: dict[tuple[int, int], np.ndarray] = {}
        stalls = self.faults.stalls_at(step)
        for s, block, m, c in dependency_order(P, self.M, self.V):
            self._enter_block(s, block, m, c, stalls)
            if block == "F":
                self._forward(s, m, c)
            else:
                self._backward(s, m, c)
            self._stall_gap = self._stall_first = None

        # Step tail: gradient reduce-scatter, global grad norm, optimizer, parameter all-gather.
        w = self.W
        for s in range(P):
            self._collective(s, w.dp_reduce_scatter, -1)
        if cfg.megatron_groups:
            if P > 1:  # each column's first and last stage: the tied embedding's gradients
                self._across_stages(w.embedding_allreduce, [0, P - 1], np.arange(C)[:, None])
            if P > 1 or self.groups[GroupKind.TP].shape[1] > 1:  # each TP group through every stage
                self._across_stages(w.grad_norm_mp, list(range(P)), self.groups[GroupKind.TP])
        else:
            self._world(w.grad_norm)
        for s in range(P):
            self._compute(s, w.optimizer, -1)
        for s in range(P):
            self._collective(s, w.dp_allgather, -1)
        if cfg.is_checkpoint_step(step):
            ck = np.exp(self.rng.standard_normal((P, C)) * 0.1) * w.checkpoint_s * 1e9
            for s in range(P):
                self._phase(s, self.id["checkpoint-save"], self.id[PhaseCategory.HOST], self.id[""], -1, self.t[s], ck[s])
            self.checkpoint_time = ck
            self.t = self.t + ck
            self._world(w.barrier)

        rec.step_start = self.per_rank(step_start)
        rec.step_end = self.per_rank(self.t)
        if self.emit:
            self._emit_aux(rec, step, step_start, stalls, hang)
        return rec

    def _where(self, rank: int) -> tuple[int, int]:
        s, c = np.argwhere(self.stage_ranks == rank)[0]
        return int(s), int(c)

    # -- blocks ----------------------------------------------------------------------------
    def _enter_block(self, s: int, block: str, m: int, c: int, stalls: list[HostStall]) -> None:
        gap = first = None
        for st in stalls:
            if st.block != block or st.microbatch != m or c != 0:  # a microbatch's stall: in its first chunk
                continue
            stage_of = self.layout.stage_of(np.array(st.ranks))
            cols = [self._where(r)[1] for r, sr in zip(st.ranks, stage_of) if sr == s]
            if not cols:
                continue
            ns = st.stall_ms_at(self.step) * _MS
            if st.mode == "sparse":
                gap = np.zeros(self.C) if gap is None else gap
                gap[cols] += ns / self.block_kernels[(s, block, c)]
            else:
                first = np.zeros(self.C) if first is None else first
                first[cols] += ns
            self.stalled[s, cols] += ns
        self._stall_gap, self._stall_first = gap, first

    def _forward(self, s: int, m: int, c: int = 0) -> None:
        w, vs = self.W, c * self.P + s  # virtual stage: chunk c of stage s
        if vs > 0:
            self._p2p((vs - 1) % self.P, s, self.fwd_out.pop((vs - 1, m)), m)
        start = self.t[s].copy()
        for layer in self._layers(c):
            self._compute(s, w.attention_fwd, m)
            self._ring(s, m)
            self._collective(s, w.tp_allreduce, m)
            if w.is_moe(layer, self.layout.ep):
                self._moe(s, m, layer, backward=False)
            else:
                self._compute(s, w.mlp_fwd, m)
            self._collective(s, w.tp_allreduce, m)
        if self._last(s, c):
            self._compute(s, w.loss_fwd, m)
        self._phase(s, self.id["forward-compute"], self.id[PhaseCategory.COMPUTE], self.id[""], m, start, self.t[s] - start)
        if not self._last(s, c):
            self.fwd_out[(vs, m)] = self.t[s].copy()

    def _backward(self, s: int, m: int, c: int = 0) -> None:
        w, vs = self.W, c * self.P + s
        if not self._last(s, c):
            self._p2p((vs + 1) % self.P, s, self.bwd_out.pop((vs + 1, m)), m)
        start = self.t[s].copy()
        if self._last(s, c):
            self._compute(s, w.loss_bwd, m)
        for layer in reversed(self._layers(c)):
            if w.is_moe(layer, self.layout.ep):
                self._moe(s, m, layer, backward=True)
            else:
                self._compute(s, w.mlp_bwd, m)
            self._collective(s, w.tp_allreduce, m)
            self._compute(s, w.attention_bwd, m)
            self._ring(s, m)
            self._collective(s, w.tp_allreduce, m)
        self._phase(s, self.id["backward-compute"], self.id[PhaseCategory.COMPUTE], self.id[""], m, start, self.t[s] - start)
        if vs > 0:
            self.bwd_out[(vs, m)] = self.t[s].copy()

    def _moe(self, s: int, m: int, layer: int, backward: bool) -> None:
        w = self.W
        key = (s, m, layer)
        if backward:
            self.tok = self._tok_cache.pop(key)
        else:
            eg = self.groups[GroupKind.EP]
            share = self.rng.dirichlet(np.full(eg.shape[1], self.cfg.moe_alpha), size=eg.shape[0]) * eg.shape[1]
            tok = np.empty(self.C)
            tok[eg] = share
            self.tok = self._tok_cache[key] = tok
        start = self.t[s].copy()
        if backward:
            self._collective(s, w.ep_alltoall, m)
            self._compute(s, w.experts_bwd, m)
            self._collective(s, w.ep_alltoall, m)
            self._compute(s, w.router_bwd, m)
        else:
            self._compute(s, w.router_fwd, m)
            self._collective(s, w.ep_alltoall, m)
            self._compute(s, w.experts_fwd, m)
            self._collective(s, w.ep_alltoall, m)
        name = self.id["moe_layer-bwd" if backward else "moe_layer"]
        self._phase(s, name, self.id[PhaseCategory.COMPUTE], self.id[""], m, start, self.t[s] - start)
        self.tok = np.ones(self.C)

    def _ring(self, s: int, m: int) -> None:
        """Ring attention's exchanges around the cp group (none without context parallelism)."""
        for _ in range(self.layout.cp - 1):
            self._collective(s, self.W.cp_ring, m)

    # -- operations ------------------------------------------------------------------------
    def _compute(self, s: int, op: ComputeOp, m: int) -> None:
        a = self.ops[op.phase]
        C, K = self.C, len(a.base_ns)
        noise = np.exp(self.rng.standard_normal((C, K)) * self.cfg.jitter)
        seq = self.seq[m][:, None] ** a.seq_exp if m >= 0 else 1.0
        d = a.base_ns * (self.warm * seq) * noise
        if a.has_moe:
            d = d * np.where(a.moe, self.tok[:, None], 1.0)
        fault = self.faults.compute_multiplier(self.step, op.phase)
        if fault is not None:
            d = d * fault[self.stage_ranks[s]][:, None]
        gap = np.full((C, K), self.W.launch_gap_us * _US)
        if self._stall_gap is not None:
            gap += self._stall_gap[:, None]
        if self._stall_first is not None:
            gap[:, 0] += self._stall_first
            self._stall_first = None
        ends = self.t[s][:, None] + np.cumsum(gap + d, axis=1)
        starts = ends - d
        end = ends[:, -1]
        self._phase(s, a.phase_id, self.id[PhaseCategory.COMPUTE], self.id[""], m, self.t[s], end - self.t[s])
        self._kernels(s, STREAMS[PhaseCategory.COMPUTE], a.name_ids, starts, d)
        self.busy[s] += d.sum(1)
        self.t[s] = end

    def _group_link_factors(self, step: int) -> dict[str, np.ndarray]:
        """Per group kind, a ``(P, nG)`` transfer factor for the groups a group-link fault holds."""
        out: dict[str, np.ndarray] = {}
        for eff in self.faults.group_links_at(step):
            if eff.kind not in self.groups:
                continue
            members = self.stage_ranks[:, self.groups[eff.kind]]  # (P, nG, size) global ranks
            hit = np.isin(members, list(eff.ranks)).any(-1)
            f = out.setdefault(eff.kind, np.ones(hit.shape))
            f[hit] = np.maximum(f[hit], eff.factor)
        return out

    def _transfer(self, op: CommOp, n: int) -> np.ndarray:
        return op.kernel.us * _US * np.exp(self.rng.standard_normal(n) * 0.05)

    def _collective(self, s: int, op: CommOp, m: int) -> None:
        g = self.groups[op.group]
        if g.shape[1] == 1:
            return  # a group of one runs no collective
        arrive = self.t[s]
        xfer = self._transfer(op, g.shape[0])
        xfer = xfer * np.where(self.group_spans[op.group][s], op.inter_host, 1.0)
        if self.link is not None:
            lf = self.link[self.group_hosts[op.group][s]].max(-1)
            xfer = xfer * np.where(self.group_spans[op.group][s], lf, 1.0)
        if op.group in self.group_link:
            xfer = xfer * self.group_link[op.group][s]
        if m >= 0 and op.kernel.seq_exp:
            xfer = xfer * self.seq[m][g[:, 0]] ** op.kernel.seq_exp
        if op.moe:
            xfer = xfer * self.tok[g].max(1)
        end = np.empty(self.C)
        end[g] = (arrive[g].max(1) + xfer)[:, None]
        self._phase(s, self.names.id(op.phase), self.id[PhaseCategory.COMM], self.id[op.group], m, arrive, end - arrive)
        self._kernels(s, STREAMS[op.group], np.array([self.names.id(op.kernel.name)], np.int32),
                      arrive[:, None], (end - arrive)[:, None])
        self.waiting[s] += end - arrive
        self.t[s] = end

    def _across_stages(self, op: CommOp, stages: list[int], cols: np.ndarray) -> None:
        """A collective over groups that span stages: group ``g`` is the columns ``cols[g]`` of
        every stage in ``stages`` (``cols`` covers each column once). It ends for all members at
        the last arrival plus the transfer, slower where a member crosses hosts or a slow link."""
        arrive = self.t[stages][:, cols]  # (S, nG, k)
        last = arrive.max(axis=(0, 2))
        hosts = self.host_of[self.stage_ranks[stages][:, cols]]  # (S, nG, k)
        spans = (hosts != hosts[:1, :, :1]).any(axis=(0, 2))
        xfer = self._transfer(op, cols.shape[0]) * np.where(spans, op.inter_host, 1.0)
        if self.link is not None:
            lf = self.link[hosts].max(axis=(0, 2))
            xfer = xfer * np.where(spans, lf, 1.0)
        end = last + xfer
        kid = np.array([self.names.id(op.kernel.name)], np.int32)
        for s in stages:
            start = self.t[s].copy()
            stop = start.copy()
            stop[cols] = end[:, None]
            self._phase(s, self.names.id(op.phase), self.id[PhaseCategory.COMM], self.id[op.group], -1, start, stop - start)
            self._kernels(s, STREAMS[op.group], kid, start[:, None], (stop - start)[:, None])
            self.waiting[s] += stop - start
            self.t[s] = stop

    def _world(self, op: CommOp) -> None:
        arrive = self.t
        xfer = self._transfer(op, 1)[0] * (op.inter_host if self.n_hosts > 1 else 1.0)
        if self.link is not None:
            xfer *= self.link.max()
        end = np.full_like(arrive, arrive.max() + xfer)
        kid = np.array([self.names.id(op.kernel.name)], np.int32)
        for s in range(self.P):
            self._phase(s, self.names.id(op.phase), self.id[PhaseCategory.COMM], self.id[GroupKind.WORLD], -1, arrive[s], end[s] - arrive[s])
            self._kernels(s, STREAMS[GroupKind.WORLD], kid, arrive[s][:, None], (end[s] - arrive[s])[:, None])
        self.waiting += end - arrive
        self.t = end

    def _p2p(self, src: int, dst: int, send_post: np.ndarray, m: int) -> None:
        op = self.W.pp_p2p
        # neighbouring stages share their link; the interleaved schedule's last → first stage
        # transfer has one of its own (a two-stage pipeline's wraps onto the same pair)
        link = min(src, dst) if abs(src - dst) == 1 or self.P == 2 else self.P - 1
        post = self.t[dst]
        xfer = self._transfer(op, self.C) * np.where(self.pp_spans[link], op.inter_host, 1.0)
        xfer = xfer * self.seq[m] ** op.kernel.seq_exp
        if self.link is not None:
            xfer = xfer * np.where(self.pp_spans[link], self.link[self.pp_hosts[link]].max(-1), 1.0)
        end = np.maximum(post, send_post) + xfer
        kid = np.array([self.names.id(op.kernel.name)], np.int32)
        self._phase(dst, self.id["pp-recv"], self.id[PhaseCategory.COMM], self.id[GroupKind.PP], m, post, end - post)
        self._phase(src, self.id["pp-send"], self.id[PhaseCategory.COMM], self.id[GroupKind.PP], m, send_post, end - send_post)
        self._kernels(dst, STREAMS[GroupKind.PP], kid, post[:, None], (end - post)[:, None])
        self._kernels(src, STREAMS[GroupKind.PP], kid, send_post[:, None], (end - send_post)[:, None])
        self.waiting[dst] += end - post
        self.t[dst] = end

    # -- emission --------------------------------------------------------------------------
    def _phase(self, s: int, name: int, cat: int, group: int, m: int, start: np.ndarray, dur: np.ndarray) -> None:
        if self.emit:
            self.rec.phase_chunks.append((self.stage_ranks[s], m, name, cat, group, start.copy(), dur.copy()))

    def _kernels(self, s: int, stream: int, name_ids: np.ndarray, start: np.ndarray, dur: np.ndarray) -> None:
        if self.emit:
            self.rec.kernel_chunks.append(
                (self.stage_ranks[s], self.local_rank[s], stream, name_ids, self.id[KernelKind.KERNEL], start, dur))

    def _emit_aux(self, rec: StepRecords, step: int, step_start: np.ndarray, stalls: list[HostStall], hang) -> None:
        start = self.per_rank(step_start)
        end = self.per_rank(self.t)
        rec.stacks = stack_model.step_stacks(
            step=step, start=start, end=end, busy=self.per_rank(self.busy), waiting=self.per_rank(self.waiting),
            dataloader=self.per_rank(self.dataloader_time), checkpoint=self.per_rank(self.checkpoint_time),
            stalled=self.per_rank(self.stalled), stalls=stalls, hang=hang, rate_hz=self.cfg.stack_rate_hz,
            to_ns=rec.to_ns, hang_observed_s=HANG_OBSERVED_S)
        rec.hw = telemetry.step_samples(
            step=step, start=start, topology=self.topology, faults=self.faults, rng=self.aux_rng, to_ns=rec.to_ns)

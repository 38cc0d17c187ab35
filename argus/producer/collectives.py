"""Collectives and p2p, seen where every Python caller meets: the ``ProcessGroup`` methods.

``dist.all_reduce``, FSDP2's ``all_gather_into_tensor`` / ``reduce_scatter_tensor``,
``batch_isend_irecv``, ``dist.send`` … all end in a method of the process group
(``pg.allreduce``, ``pg._allgather_base``, ``pg.send`` …). Argus wraps those methods on the
class and nothing in ``torch.distributed``'s namespace: the functions users hold, the
identities ``P2POp`` checks (``op is isend``) and the returned ``Work`` objects are PyTorch's
own, untouched. A call is recorded when it starts (the rank's in-flight block: this group's
``issued`` count, since when) and when it **completes** — its future's callback, or the
``Work.wait`` that returned, whichever comes first — as one ``<group kind>-<op>`` phase
(``dp-allreduce``, ``pp-send``) from start to completion. Time the training thread spends
blocked in ``wait`` is waiting, not work, for the compute phase around it.

On a CUDA device the interval is measured on the GPU instead, from an event on the launching
stream before the call (the inputs are ready: this rank has arrived). Its end: for an
asynchronous NCCL collective, the duration ProcessGroupNCCL measured itself, read from the Flight
Recorder (``flight_recorder.py``; nothing is attached to the work, whose future callback would
make a pool stream wait and record the outputs on it); for a synchronous one (no ``Work``), an
event recorded after the return on the stream that waits for it; where the Flight Recorder
cannot time (``TORCH_NCCL_ENABLE_TIMING=0``, coalesced batches), an event recorded in the work's
future callback, which completes when the collective does (``_track_on_gpu``). Per rank
only arrival and completion exist; waiting and transfer are separated across ranks by the
analysis (the last arrival starts the transfer). Works without a future (gloo p2p) are timed
by their ``wait`` on the CPU.

Calls that C++ makes itself never pass here: DDP's bucket all-reduces. For them DDP gets a
comm hook that does what DDP's built-in one does — multiply the bucket by ``1/world`` and
all-reduce it, bit for bit the same result (the built-in multiplies while copying; a
*division*, as ``default_hooks.allreduce_hook`` does, changes the last bit for world sizes
that are not powers of two) — through ``dist.all_reduce``, so the buckets are seen like any
collective. A comm hook the user registers later is called from ours. DDP with mixed
precision or the compiled-autograd reducer is left alone.

A point-to-point op counts on the pair (``group_key([me, peer])``), so the side that never
posted its matching send or receive is the one behind. Hook bodies never raise into the
caller, and under ``torch.compile`` tracing they call straight through.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Literal

from argus.producer.flight_recorder import FlightRecorderTimes, fr_key, nccl_dump
from argus.producer.recorder import GROUP, now_ns
from argus.vocab import GroupKind
from argus.wire import group_key

__all__ = ["CollectiveTracker", "PG_METHODS"]

log = logging.getLogger("argus.producer")

#: ProcessGroup method → op name in phase names (``<kind>-<op>``); p2p methods marked.
PG_METHODS: dict[str, str] = {
    "allreduce": "allreduce", "allreduce_coalesced": "allreduce", "allgather": "allgather",
    "_allgather_base": "allgather", "allgather_coalesced": "allgather", "allgather_into_tensor_coalesced": "allgather",
    "all_gather_single": "allgather", "all_gather_single_coalesced": "allgather",
    "reduce_scatter": "reduce-scatter", "_reduce_scatter_base": "reduce-scatter",
    "reduce_scatter_tensor_coalesced": "reduce-scatter", "reduce_scatter_single": "reduce-scatter",
    "reduce_scatter_single_coalesced": "reduce-scatter", "alltoall": "alltoall", "alltoall_base": "alltoall",
    "all_to_all_single": "alltoall", "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier",
    "monitored_barrier": "barrier", "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv",
    "recv_anysource": "recv",
}
_P2P_PEER_ARG = {"send": 1, "recv": 1}  # group-local peer rank is the second positional argument
_MAX_PENDING = 65536


@dataclass(frozen=True, slots=True)
class _Group:
    kind: str
    slot: int
    kind_code: int


class CollectiveTracker:
    def __init__(self, runtime: Any, is_compiling: Callable[[], bool]):
        self.rt = runtime
        self.is_compiling = is_compiling
        self.patches: list[tuple[Any, str, Any]] = []
        self.groups: dict[tuple[int, int], _Group] = {}
        self.names: dict[str, int] = {}
        #: id(work) → (launch record, the work): completion seen on the CPU. The work is held until
        #: then, or its id could be reused: DDP's hook keeps only the future, so a bucket's Work
        #: object dies at once, the next bucket's Work can take its address, and the first
        #: completion would finish the second's launch while the second's found nothing — one
        #: of a step's two bucket all-reduces lost in 8 of 120 rank-steps of a real DDP job
        self.pending: dict[int, tuple[tuple, Any]] = {}
        self.gpu_names: dict[int, int] = {}  # id(work) → name id, for works timed on the GPU
        self.local = threading.local()
        self.buckets_launched = 0  # DDP gradient buckets handed to all-reduce so far …
        self.last_bucket_ns = 0  # … and when the last one was
        self.last_bucket_runq = 0
        self.instrumented_ddp: set[int] = set()
        #: id(pg) → launches issued between its ``_start_coalescing`` and ``_end_coalescing``
        #: (``batch_isend_irecv`` on NCCL): they complete with the coalesced work the end returns
        self.coalescing: dict[int, list[tuple]] = {}
        self.coalesced: dict[int, list[tuple]] = {}  # id(coalesced work) → its launches after the first
        self._ddp_register: Callable | None = None
        self._fr: FlightRecorderTimes | Literal[False] | None = None  # False: not usable in this process
        self.fr_dump: Callable[[], dict] | None = None  # tests: a ring of their own

    # -- install ---------------------------------------------------------------------------
    def install(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from torch.distributed import ProcessGroup, Work

        for method, op in PG_METHODS.items():
            original = getattr(ProcessGroup, method, None)
            if original is not None:
                self._patch(ProcessGroup, method, self._wrap(original, op, method))
        self._patch(Work, "wait", self._wrap_wait(Work.wait))
        if hasattr(ProcessGroup, "_start_coalescing") and hasattr(ProcessGroup, "_end_coalescing"):
            self._patch(ProcessGroup, "_start_coalescing", self._wrap_start_coalescing(ProcessGroup._start_coalescing))
            self._patch(ProcessGroup, "_end_coalescing", self._wrap_end_coalescing(ProcessGroup._end_coalescing))
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self._ddp_register = DDP.register_comm_hook
            self._patch(DDP, "register_comm_hook", self._wrap_register_comm_hook(DDP.register_comm_hook))
        except ImportError:
            pass

    def uninstall(self) -> None:
        for owner, name, old in reversed(self.patches):
            setattr(owner, name, old)
        self.patches.clear()

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        self.patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    # -- groups ----------------------------------------------------------------------------
    def _group(self, pg: Any, peer_local: int | None) -> _Group:
        key = (id(pg), -1 if peer_local is None else peer_local)
        found = self.groups.get(key)
        if found is None:
            import torch.distributed as dist

            rt = self.rt
            try:
                ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
            except Exception:  # noqa: BLE001 - a group this process is not part of, or not registered
                ranks = list(range(rt.identity.world_size))
            peer = None
            if peer_local is not None and 0 <= peer_local < len(ranks):
                peer = ranks[peer_local]
            members = sorted({rt.identity.rank, peer}) if peer is not None else ranks
            kind = rt.kind_of_group(members, peer)
            code = GROUP.get(kind, 0)
            slot = rt.ring.inflight.slot(group_key(members), code, len(members), min(members) if members else -1)
            found = self.groups[key] = _Group(kind, slot, code)
        return found

    def _name_id(self, name: str) -> int:
        found = self.names.get(name)
        if found is None:
            found = self.names[name] = self.rt.recorder.name_id(name)
        return found

    # -- launch and completion ---------------------------------------------------------------
    def _wrap(self, original: Callable, op: str, method: str) -> Callable:
        tracker = self
        peer_arg = _P2P_PEER_ARG.get(method)
        collective = op not in ("send", "recv")

        @functools.wraps(original)
        def pg_method(pg: Any, *args: Any, **kwargs: Any) -> Any:
            rt = tracker.rt
            if not rt.active or tracker.is_compiling() or getattr(tracker.local, "inside", False):
                return original(pg, *args, **kwargs)
            try:
                peer = args[peer_arg] if peer_arg is not None and len(args) > peer_arg else None
                device = _cuda_device(args) if rt.cuda is not None else -1
                launch = tracker._launch(pg, op, peer if isinstance(peer, int) else None, device != -1,
                                         device if device is not None and device >= 0 else None)
            except Exception as exc:  # noqa: BLE001
                rt.fail(f"collective tracking failed ({type(exc).__name__}: {exc})")
                return original(pg, *args, **kwargs)
            tracker.local.inside = True
            try:
                work = original(pg, *args, **kwargs)
            except BaseException:
                tracker._finish_launch(launch, now_ns())
                raise
            finally:
                tracker.local.inside = False
            try:
                batch = tracker.coalescing.get(id(pg))
                if batch is not None:  # its own work is a placeholder: the coalesced one completes it
                    batch.append(launch)
                    return work
                # a point-to-point op has a p2p sequence of its own: no collective record to find
                tracker._track(work, launch, pg if collective else None, op)
            except Exception as exc:  # noqa: BLE001
                rt.fail(f"collective tracking failed ({type(exc).__name__}: {exc})")
            return work

        return pg_method

    def _wrap_start_coalescing(self, original: Callable) -> Callable:
        tracker = self

        @functools.wraps(original)
        def start(pg: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(pg, *args, **kwargs)
            if tracker.rt.active and not tracker.is_compiling():
                tracker.coalescing[id(pg)] = []
            return out

        return start

    def _wrap_end_coalescing(self, original: Callable) -> Callable:
        tracker = self

        @functools.wraps(original)
        def end(pg: Any, *args: Any, **kwargs: Any) -> Any:
            launches = tracker.coalescing.pop(id(pg), None)
            try:
                work = original(pg, *args, **kwargs)
            except BaseException:
                for launch in launches or ():
                    tracker._finish_launch(launch, now_ns())
                raise
            if launches:
                try:
                    tracker._track_coalesced(work, launches)
                except Exception as exc:  # noqa: BLE001
                    tracker.rt.fail(f"collective tracking failed ({type(exc).__name__}: {exc})")
            return work

        return end

    def _track_coalesced(self, work: Any, launches: list[tuple]) -> None:
        """Launches of one coalesced batch complete with its work: on the GPU each by its own
        event in the work's callback; on the CPU the first by the work (callback or ``wait``)
        and the others with it."""
        cpu = work is not None and launches[0][5] is None and not (self.rt.cuda is not None and self.rt.cuda.capturing())
        if cpu:
            if len(self.coalesced) >= _MAX_PENDING:
                self.coalesced.pop(next(iter(self.coalesced)))
            self.coalesced[id(work)] = launches[1:]
            self._track(work, launches[0])
            return
        for launch in launches:
            self._track(work, launch)

    def _launch(self, pg: Any, op: str, peer_local: int | None, on_cuda: bool = True,
                device: int | None = None) -> tuple:
        """``on_cuda``: the collective's tensors are on a CUDA device (GPU events time it); a
        gloo collective on CPU tensors inside a GPU job is timed on the host — an event on the
        GPU's stream would time that stream's queue instead. ``device``: the tensors' CUDA
        device where it is known (None: the rank's); both events go on its current stream."""
        rt = self.rt
        main = rt.on_main_thread()
        if main:
            rt.collective_starts()
        g = self._group(pg, peer_local)
        name = f"{g.kind or GroupKind.WORLD}-{op}"
        t0 = now_ns()
        nid = self._name_id(name)
        rt.comm_issued += 1
        rt.ring.inflight.issued(g.slot, nid, t0)
        m0 = _mark(rt.cuda, device) if rt.cuda is not None and on_cuda else None  # GPU: the inputs are ready here
        # CPU: the training thread's run-queue delay so far, so that a collective it waits for
        # itself (``wait()``) can record how much of its interval the thread spent preempted
        rq0 = rt.sched.runq_ns() if main and m0 is None else -1
        return (t0, rt.mb_context, rt.step, g, nid, m0, rq0, device)

    def _track(self, work: Any, launch: tuple, pg: Any = None, op: str = "") -> None:
        if work is None:
            # a synchronous collective the backend waited for itself (torch ≥ 2.8: "sync'ed at
            # CPP level", no Work). On a GPU it returns once the current stream waits on the
            # collective — not once the collective ran: an event recorded there now completes
            # with it (the CPU's return is its launch, not its end)
            if launch[5] is not None:
                try:
                    self.rt.cuda.phase(launch[5], _mark(self.rt.cuda, launch[7]), (self._gpu_done, launch))
                    return
                except Exception:  # noqa: BLE001 - no event: the host's interval is all there is
                    pass
            self._finish_launch(launch, now_ns())
            return
        if launch[5] is None and self.rt.cuda is not None and self.rt.cuda.capturing():
            # inside CUDA-graph capture nothing runs: the collective runs at each replay. A
            # future callback here would fork a pool stream into the capture that is never
            # joined (the capture fails); leave the work alone, record nothing, and settle
            # its in-flight count so hang snapshots do not see it waiting forever
            self.rt.ring.inflight.completed(launch[3].slot, launch[0], launch[0])
            return
        if launch[5] is not None and pg is not None and self._track_by_flight_recorder(work, launch, pg, op):
            return
        if launch[5] is not None and self._track_on_gpu(work, launch):
            return
        key = id(work)
        if len(self.pending) >= _MAX_PENDING:
            self.pending.pop(next(iter(self.pending)))
        self.pending[key] = (launch, work)
        try:
            fut = work.get_future()
        except Exception:  # noqa: BLE001 - gloo p2p works have no future: wait() reports them
            return
        fut.add_done_callback(lambda _f, key=key: self._finish(key))

    def _track_by_flight_recorder(self, work: Any, launch: tuple, pg: Any, op: str) -> bool:
        """An asynchronous collective on a CUDA device: its end from ProcessGroupNCCL's own
        timing in the Flight Recorder (``flight_recorder.py``), nothing attached to the work."""
        fr = self._flight_recorder()
        if fr is None:
            return False
        key = fr_key(pg)
        if key is None or not fr.expect(key, launch, op):
            return False
        self.rt.cuda.phase(launch[5], launch[5], (fr.arrived, key))  # the arrival, on the GPU clock
        return True

    def _flight_recorder(self) -> FlightRecorderTimes | None:
        fr = self._fr
        if fr is None:
            dump = self.fr_dump if self.fr_dump is not None else nccl_dump()
            if dump is None or not getattr(self.rt, "nccl_timing", False) or self.rt.cuda is None:
                self._fr = False
                return None
            fr = self._fr = FlightRecorderTimes(dump, self._gpu_done)
            self.rt.cuda.on_pass.append(fr.poll)
        if fr is False:
            return None
        if not fr.usable:
            log.warning("argus: the Flight Recorder does not time collectives here (%s); asynchronous NCCL "
                        "collectives are timed by a future callback instead, which records their outputs on a "
                        "pool stream", "TORCH_FR_BUFFER_SIZE=0" if fr.empty_reads else
                        "records of other ops under the keys" if fr.mismatched else
                        "no durations" if fr.untimed else "the ring could not be read")
            self._fr = False
            return None
        return fr

    def _track_on_gpu(self, work: Any, launch: tuple) -> bool:
        """On a CUDA device, where the Flight Recorder cannot time it: the collective's end is an
        event recorded in its future's callback, which runs under a stream guard that waits on the
        stream the collective runs on — so the event completes when the collective completes on
        the GPU, whatever the CPU did. The callback has side effects on the job (a pool stream made
        to wait, the outputs recorded on it: see ``flight_recorder.py``); it is the fallback."""
        rt = self.rt
        try:
            fut = work.get_future()
        except Exception:  # noqa: BLE001 - no future (some p2p works): timed by wait() on the CPU
            return False
        self.gpu_names[id(work)] = launch[4]
        if len(self.gpu_names) > _MAX_PENDING:
            self.gpu_names.pop(next(iter(self.gpu_names)))

        def on_done(_f: Any, launch: tuple = launch) -> None:
            try:
                rt.cuda.phase(launch[5], _mark(rt.cuda, launch[7]), (self._gpu_done, launch))
            except Exception:  # noqa: BLE001 - on the backend's thread: never raise
                pass

        fut.add_done_callback(on_done)
        return True

    def _gpu_done(self, launch: tuple, t0: int | None, t1: int | None) -> None:
        """The collective's GPU interval (resolved on the CUDA-event thread): from the moment its
        inputs were ready on the launching stream (this rank's arrival) to its completion.
        ``None`` times: the timer dropped the span (its cap, a CUDA error): no phase, but the
        in-flight count is settled, or hang snapshots would see this rank waiting in it forever."""
        _, mb, step, g, nid = launch[:5]
        try:
            if t0 is None or t1 is None:
                self.rt.ring.inflight.completed(g.slot, launch[0], launch[0])
                return
            self.rt.ring.inflight.completed(g.slot, launch[0], t1)
            self.rt.recorder.phase_ids(step, t0, t1 - t0, mb, nid, 1, g.kind_code)
        except Exception:  # noqa: BLE001
            pass

    def _finish(self, key: int, waited: bool = False) -> None:
        """``waited``: the training thread returns from ``wait()`` on it now, so the end is
        when that thread ran again, and its run-queue delay since the launch is recorded as
        the phase's ``wait_ns`` (on a busy host a receive's end is late by that much)."""
        entry = self.pending.pop(key, None)
        if entry is not None:
            launch = entry[0]
            t1 = now_ns()
            rq = self.rt.sched.runq_ns() - launch[6] if waited and launch[6] >= 0 else -1
            self._finish_launch(launch, t1, max(rq, -1))
            for other in self.coalesced.pop(key, ()):  # the rest of its coalesced batch
                self._finish_launch(other, t1)

    def _finish_launch(self, launch: tuple, t1: int, wait_ns: int = -1) -> None:
        t0, mb, step, g, nid = launch[:5]
        try:
            rt = self.rt
            rt.ring.inflight.completed(g.slot, t0, t1)
            rt.recorder.phase_ids(step, t0, t1 - t0, mb, nid, 1, g.kind_code, min(wait_ns, t1 - t0))
        except Exception:  # noqa: BLE001 - a completion callback on the backend's thread must not raise
            pass

    def _wrap_wait(self, original: Callable) -> Callable:
        tracker = self

        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            rt = tracker.rt
            if not rt.active or tracker.is_compiling():
                return original(work, *args, **kwargs)
            entry = tracker.pending.get(id(work))
            name_id = entry[0][4] if entry is not None else tracker.gpu_names.get(id(work))
            main = rt.on_main_thread()
            m0 = rt.mark() if main and rt.cuda is None else None  # CPU: time blocked here is waiting
            if main and name_id is not None:
                rt.set_activity(name_id)
            try:
                return original(work, *args, **kwargs)
            finally:
                try:
                    tracker._finish(id(work), waited=main)
                    if main:
                        rt.add_wait(m0, rt.mark())
                        if name_id is not None:
                            rt.restore_activity()
                except Exception as exc:  # noqa: BLE001
                    rt.fail(f"collective tracking failed ({type(exc).__name__}: {exc})")

        return wait

    # -- DDP -------------------------------------------------------------------------------
    def maybe_instrument_ddp(self, module: Any) -> None:
        """At a DDP model's first forward (its reducer exists by then): time its buckets."""
        module = getattr(module, "_orig_mod", module)  # torch.compile(DDP(model)): the DDP inside
        if id(module) in self.instrumented_ddp:
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not isinstance(module, DDP):
            return
        self.instrumented_ddp.add(id(module))
        if getattr(module, "mixed_precision", None) is not None or getattr(module, "_use_python_reducer", False):
            return  # their bucket arithmetic is not the plain built-in one: leave them alone
        if getattr(module, "_argus_user_hook", None) is not None:
            return
        try:
            self._register_ddp_hook(module)
        except Exception as exc:  # noqa: BLE001 - e.g. a hook already registered before tracing began
            log.info("argus: DDP gradient all-reduce not timed (%s)", exc)

    def _register_ddp_hook(self, ddp: Any) -> None:
        import torch
        import torch.distributed as dist

        tracker, pg = self, ddp.process_group
        scale = 1.0 / pg.size()

        def argus_allreduce(state: Any, bucket: Any) -> Any:
            rt = tracker.rt
            tracker.last_bucket_ns = now_ns()
            tracker.last_bucket_runq = rt.sched.runq_ns()
            tracker.buckets_launched += 1
            user = getattr(ddp, "_argus_user_hook", None)
            if user is not None:
                return user[1](user[0], bucket)
            tensor = bucket.buffer()
            tensor.mul_(scale)  # DDP's built-in hook multiplies by 1/world too (see the module docstring)
            return dist.all_reduce(tensor, group=pg, async_op=True).get_future().then(lambda f: f.value()[0])

        # DDP checks the hook's annotations
        argus_allreduce.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                                           "return": torch.futures.Future[torch.Tensor]}
        assert self._ddp_register is not None
        self._ddp_register(ddp, None, argus_allreduce)
        ddp._argus_hooked = True

    def _wrap_register_comm_hook(self, original: Callable) -> Callable:
        """DDP accepts one comm hook: once Argus registered its own, the user's is called from it."""
        tracker = self

        @functools.wraps(original)
        def register_comm_hook(ddp: Any, state: Any, hook: Callable) -> None:
            if getattr(ddp, "_argus_hooked", False):
                ddp._argus_user_hook = (state, hook)
                return None
            tracker.instrumented_ddp.add(id(ddp))  # the user's own hook: DDP is theirs to time
            return original(ddp, state, hook)

        return register_comm_hook


def _mark(timer: Any, device: int | None) -> Any:
    """An event on the current stream of ``device`` (None: the rank's device)."""
    return timer.mark() if device is None else timer.mark(device=device)


def _cuda_device(args: tuple) -> int | None:
    """The CUDA device of a process-group call's first tensor argument: its index, -1 on the
    CPU (a gloo group in a GPU job: timed on the host), None where none is found or the index
    is not known (the rank's device)."""
    for a in args:
        while isinstance(a, (list, tuple)) and a:
            a = a[0]
        is_cuda = getattr(a, "is_cuda", None)
        if isinstance(is_cuda, bool):
            if not is_cuda:
                return -1
            index = getattr(getattr(a, "device", None), "index", None)
            return index if isinstance(index, int) else None
    return None


def _on_cuda(args: tuple) -> bool:
    """Whether a process-group call's tensors are on a CUDA device: its first tensor argument
    (a tensor, or a list of tensors or of lists of them), True when none is found."""
    for a in args:
        while isinstance(a, (list, tuple)) and a:
            a = a[0]
        is_cuda = getattr(a, "is_cuda", None)
        if isinstance(is_cuda, bool):
            return is_cuda
    return True

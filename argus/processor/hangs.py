"""Live hang detection on one host: notice that a job stopped, and record who is where.

Every cycle the processor reads each local rank's in-flight block from its ring
(``argus.wire.inflight``): step, last finished step, what the training thread is doing, and
per process group how many collectives the rank started and completed. That works while a
rank is stuck in C++ holding the GIL, and after it died (the ring outlives it).

**Progress** is any change of a rank's last finished step or of its completed collectives.
When no local rank of a job has progressed for the **threshold** — ``max(min_s,
step_factor × median step time)`` of the job's recent steps, so a slow job is not called
hung for being slow — the watch takes a **snapshot**: one row per local rank into the
store's ``hangs`` table at once (not at the next window: the job may never finish another),
with the main-thread stack (``py-spy dump``, which works while the rank holds the GIL) of
every rank that is not waiting in a collective and of one rank that is. The analysis
(``argus.analysis.hangs``) joins the snapshots of all hosts and names the ranks that never
entered the collective the others wait in.

Before a job's first finished step nothing is armed (start-up and first compilation take as
long as they take). One snapshot per stall; a job that resumes re-arms the watch.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from argus.errors import ConfigError
from argus.wire import GROUP_KINDS, InflightState

__all__ = ["HangConfig", "HangWatch", "RankView", "snapshot_rows"]

log = logging.getLogger("argus.processor")


@dataclass(kw_only=True, frozen=True)
class HangConfig:
    min_s: float = 30.0  # never a hang before this long without progress (env ARGUS_HANG_MIN_S)
    step_factor: float = 10.0  # … nor before this many median step times (env ARGUS_HANG_STEP_FACTOR)
    max_stacks: int = 8  # py-spy dumps per snapshot (ranks not waiting first, then one waiting)

    def __post_init__(self) -> None:
        if self.min_s <= 0 or self.step_factor <= 0 or self.max_stacks < 0:
            raise ConfigError(f"hang detection: min_s ({self.min_s}) and step_factor ({self.step_factor}) must be "
                              f"positive, max_stacks ({self.max_stacks}) not negative")


@dataclass
class RankView:
    """One local rank as the watch reads it each cycle."""

    key: tuple[str, str]  # attempt
    rank: int
    pid: int | None
    read: Callable[[], InflightState | None]  # its in-flight block (None: unreadable)
    name: Callable[[int], str]  # its ring's name id → string
    alive: bool = True


@dataclass
class _Job:
    durations: deque = field(default_factory=lambda: deque(maxlen=64))
    fingerprint: tuple = ()
    changed_at: float = 0.0
    armed: bool = False
    reported: bool = False
    last_states: dict[int, InflightState] = field(default_factory=dict)


class HangWatch:
    def __init__(self, config: HangConfig, host: str,
                 dump: Callable[[int], str | None] = lambda pid: None, clock: Callable[[], float] = time.monotonic,
                 wall_ns: Callable[[], int] = time.time_ns):
        self.config = config
        self.host = host
        self.dump = dump
        self.clock = clock
        self.wall_ns = wall_ns
        self.jobs: dict[tuple[str, str], _Job] = {}
        self.last_step_wall: dict[tuple[str, str], float] = {}  # job → wall time its last finished step was reported
        self.snapshots = 0

    def steps_reported(self, key: tuple[str, str] | None, records: np.ndarray) -> None:
        if key is None:
            return
        done = records[records["end_ns"] >= 0]
        if len(done):
            self.last_step_wall[key] = self.wall_ns() / 1e9
            job = self.jobs.setdefault(key, _Job(changed_at=self.clock()))
            job.durations.extend(((done["end_ns"] - done["start_ns"]) / 1e9).tolist())

    def rank_left(self, conn: Any) -> None:
        """A rank's connection closed: it stays in the job's view as not alive (a crashed rank
        is exactly what a hang snapshot must show)."""

    def threshold_s(self, key: tuple[str, str]) -> float:
        job = self.jobs.get(key)
        median = float(np.median(job.durations)) if job is not None and job.durations else 0.0
        return max(self.config.min_s, self.config.step_factor * median)

    def check(self, views: list[RankView]) -> dict[tuple[str, str], dict[str, list]]:
        """One pass over the local ranks; returns ``{attempt: hangs-table columns}`` for each job
        that just crossed its threshold."""
        now = self.clock()
        by_job: dict[tuple[str, str], list[tuple[RankView, InflightState]]] = {}
        for v in views:
            state = v.read()
            if state is not None:
                by_job.setdefault(v.key, []).append((v, state))
        out = {}
        for key, rows in by_job.items():
            job = self.jobs.setdefault(key, _Job(changed_at=now))
            fingerprint = tuple(sorted((v.rank, s.steps_done, sum(g.completed for g in s.groups), v.alive)
                                       for v, s in rows))
            if fingerprint != job.fingerprint:
                job.fingerprint, job.changed_at, job.reported = fingerprint, now, False
            job.armed = job.armed or any(s.steps_done >= 0 for _, s in rows)
            stalled = now - job.changed_at
            threshold = self.threshold_s(key)
            if not job.armed or job.reported or stalled < threshold:
                continue
            job.reported = True
            self.snapshots += 1
            log.warning("job %s/%s: no progress on this host for %.0f s (threshold %.0f s): recording a hang snapshot",
                        key[0], key[1], stalled, threshold)
            out[key] = snapshot_rows(rows, self.host, self.wall_ns(), stalled, threshold, self.dump,
                                     self.config.max_stacks)
        return out


def _signed(k: int) -> int:
    """A u64 group key as the int64 the store keeps."""
    return k - (1 << 64) if k >= 1 << 63 else k


def _main_group(state: InflightState) -> Any:
    """The group a rank's snapshot row names: its oldest pending collective's, else the one
    it used most."""
    pending = [g for g in state.groups if g.pending > 0]
    if pending:
        return min(pending, key=lambda g: g.oldest_pending_ns or 0)
    return max(state.groups, key=lambda g: g.issued, default=None)


def snapshot_rows(rows: list[tuple[RankView, InflightState]], host: str, detected_ns: int, stalled_s: float,
                  threshold_s: float, dump: Callable[[int], str | None], max_stacks: int) -> dict[str, list]:
    cols: dict[str, list] = {c: [] for c in (
        "detected_ns", "stalled_s", "threshold_s", "rank", "host", "alive", "step", "steps_done", "activity",
        "activity_since_ns", "waiting", "group_key", "group_kind", "group_size", "group_first_rank", "op", "issued",
        "completed", "pending_since_ns", "groups", "stack", "proc_state")}
    waiting = {v.rank: any(g.pending > 0 for g in s.groups) for v, s in rows}
    # stacks: every rank that is not waiting (the likely culprits), then one that is
    order = [v for v, _ in rows if not waiting[v.rank]] + [v for v, _ in rows if waiting[v.rank]][:1]
    stacks: dict[int, str] = {}
    for v in order[:max_stacks]:
        if v.pid and v.alive:
            try:
                stacks[v.rank] = dump(v.pid) or ""
            except Exception as exc:  # noqa: BLE001 - a failed dump must not lose the snapshot
                log.info("hang snapshot: no stack of rank %d (%s)", v.rank, exc)
    for v, s in sorted(rows, key=lambda r: r[0].rank):
        g = _main_group(s)
        cols["detected_ns"].append(detected_ns)
        cols["stalled_s"].append(round(stalled_s, 3))
        cols["threshold_s"].append(round(threshold_s, 3))
        cols["rank"].append(v.rank)
        cols["host"].append(host)
        cols["alive"].append(v.alive)
        cols["step"].append(s.step)
        cols["steps_done"].append(s.steps_done)
        cols["activity"].append(v.name(s.activity) if s.activity >= 0 else "")
        cols["activity_since_ns"].append(s.activity_since_ns)
        cols["waiting"].append(waiting[v.rank])
        cols["group_key"].append(_signed(g.key) if g else 0)
        cols["group_kind"].append(GROUP_KINDS[min(g.kind_code, len(GROUP_KINDS) - 1)] if g else "")
        cols["group_size"].append(g.size if g else 0)
        cols["group_first_rank"].append(g.first_rank if g else -1)
        cols["op"].append(v.name(g.op) if g and g.op >= 0 else "")
        cols["issued"].append(g.issued if g else 0)
        cols["completed"].append(g.completed if g else 0)
        cols["pending_since_ns"].append(g.oldest_pending_ns if g else 0)
        cols["groups"].append(json.dumps([
            {"key": _signed(x.key), "kind": GROUP_KINDS[min(x.kind_code, len(GROUP_KINDS) - 1)], "size": x.size,
             "first_rank": x.first_rank, "issued": x.issued, "completed": x.completed,
             "op": v.name(x.op) if x.op >= 0 else ""} for x in s.groups]))
        cols["stack"].append(stacks.get(v.rank, ""))
        cols["proc_state"].append(proc_state(v.pid) if v.pid and v.alive else "")
    return cols


def proc_state(pid: int) -> str:
    """The process state letter of ``pid`` (``/proc/PID/stat``), "" when it cannot be read. A
    stopped (T) or uninterruptibly sleeping (D) rank inside a collective is frozen, not
    waiting: its peers wait for it, whatever its in-flight counts say."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
        return text[text.rindex(")") + 2:].split(" ", 1)[0][:1]
    except (OSError, ValueError, IndexError):
        return ""

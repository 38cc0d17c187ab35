"""The stack channel: each local rank's Python stacks, sampled from outside with py-spy.

**How it samples: one ``py-spy dump --pid P`` per sample, on a thread per rank.** Measured
on this machine (2 cores, py-spy 0.4.3, a CPU-bound target; ``/usr/bin/time`` and
``RUSAGE_CHILDREN`` over 7 s runs):

==========================================  ===========  ===========================
way                                          wall / call  py-spy CPU
==========================================  ===========  ===========================
``dump --pid P`` at 1 / 10 / 20 Hz             12–35 ms   9 / 90 / 170 ms per second
``record --rate R --duration 1`` (chunks)       1.05 s    12–14 ms per second (10–20 Hz)
``record --rate R`` long-running (10–20 Hz)        —      5 ms per second
``dump`` through the pyenv *shim* on PATH        230 ms   (a bash script per call)
==========================================  ===========  ===========================

A long-running ``record`` is the cheapest per sample, but it writes its output only when it
exits (``--format raw`` is a file of folded stacks and totals, nothing until then), so it
cannot be read incrementally. Restarting it in one-second chunks costs one attach per chunk,
the same as one ``dump``, and its raw output has neither per-sample times (to place samples
in steps) nor thread names; changing the rate means restarting it. ``dump`` gives the
thread names and an exact time per sample, changes rate at once, and fails per call with a
message we can classify (permission, process gone). At the always-on 1 Hz both cost one
attach (≈ 9 ms CPU) per second per rank; the 10 Hz suspect rate costs ≈ 90 ms CPU per second
per suspect rank, and only while it is suspect (at most ``MAX_SUSPECT_S`` per episode).
``--native`` pauses the rank for about a second: never used. The executable is looked up
once: ``$ARGUS_PY_SPY``, else next to this Python (where pip installs our dependency —
avoiding a 230 ms shim), else ``PATH``; missing, the channel is off with one log line.

**What is kept.** The main thread always (a hung rank's main thread sits idle in a wait),
other threads only while active or holding the GIL (idle helper threads would otherwise add
the same stack to every sample). Frames are folded root first, ``function (file:line)``
joined by ``;`` — py-spy's own frame text, the format of ``argus/sim/stacks.py``.

**Placing and aggregating.** Samples carry ``time.time_ns()`` (the producers' clock). A
sample is placed in a step once the rank has reported a step ending after it (producers
batch their step records) or after ``PLACE_GRACE_NS``; past the last finished step it
belongs to the next one. Consecutive samples of one thread with the same stack in the same
step become one record with a count; a record is handed on when its step has finished, when
the stack changes, or after ``RUN_FLUSH_NS`` (a hang must not hold it).

**Suspicion** (sample at ``suspect_hz`` instead of ``hz``), per rank, against the median
step time *m* of the recent steps of its attempt's ranks on this host (16 per rank, at least
3 in all): *stalled* when no finished step has arrived for more than max(3 m, 2 × its usual
interval between step reports, 2 s — producers batch once a second); *slow* when its last
step took more than 3 m or its last five a median above 1.5 m (one merely slow step — an
op-capture step, a checkpoint — must not raise every rank to the suspect rate: in
synchronous training all ranks share it). The raised rate holds ``max(HOLD_S, 3 m)`` after
the condition ends, and an episode is capped at ``MAX_SUSPECT_S`` (a day-long hang must not
cost a core for a day).

**No ptrace** (py-spy says "Permission Denied"): the processor sends that rank a
``CONTROL`` frame ``{"stacks": {"inprocess_hz": hz}}`` and the producer samples itself at
that rate (``argus/producer/stacks.py``); a later rate change sends a new one.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from argus import env as argus_env
from argus.wire.protocol import DROP_TABLES, DTYPES, Msg
from argus.processor.samplers import Output, RankHandle, Sampler

__all__ = ["PY_SPY_ENV", "StackSampler", "Suspicion", "find_py_spy", "parse_dump", "run_dump"]

SLOW_ONE = 3.0  # one step this many × the host's median step time …
SLOW_RECENT = 1.5  # … or the median of the last five this many ×
MIN_REPORT_GAP_S = 1.0  # producers batch step records this often: silence shorter than 2× is normal
log = logging.getLogger("argus.processor")

PY_SPY_ENV = argus_env.PY_SPY  # path of the py-spy executable (default: next to this Python, else on PATH)
PLACE_GRACE_NS = 3_000_000_000  # place a sample without a covering step record after this long
RUN_FLUSH_NS = 5_000_000_000  # hand on an aggregated run at least this often
DUMP_TIMEOUT_S = 5.0
MAX_BACKOFF_S = 30.0
HOLD_S = 10.0
MAX_SUSPECT_S = 300.0
_KEEP_DURATIONS = 16
MAX_FRAMES = 128


def find_py_spy(explicit: str | None = None) -> str | None:
    """The py-spy executable to run, or None: explicit > ``$ARGUS_PY_SPY`` > next to Python > PATH."""
    import shutil

    chosen = explicit or os.environ.get(PY_SPY_ENV)
    if chosen:
        return shutil.which(chosen)
    sibling = Path(sys.executable).parent / "py-spy"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("py-spy")


_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?::\s*"(.*)")?\s*$')


def parse_dump(text: str, pid: int) -> list[tuple[str, str]]:
    """``(thread name, folded frames root first)`` of the threads worth keeping in a dump."""
    out: list[tuple[str, str]] = []
    current: tuple[str, bool] | None = None
    frames: list[str] = []

    def close() -> None:
        if current is not None and current[1] and frames:
            out.append((current[0], ";".join(reversed(frames))))

    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            close()
            tid, state, name = m.group(1), m.group(2), m.group(3)
            main = name == "MainThread" or tid == str(pid)
            current = (name or f"thread {tid}", main or "active" in state or "gil" in state)
            frames = []
        elif current is not None and line.startswith("    ") and not line.startswith("        "):
            if len(frames) < MAX_FRAMES:  # leaf first: a deep recursion loses its root side
                frames.append(line.strip())
    close()
    return out


def run_dump(py_spy: str, pid: int, timeout_s: float = DUMP_TIMEOUT_S) -> tuple[str, str]:
    """One ``py-spy dump``: ``("ok", text)`` or ``(kind, message)`` with kind ``denied`` (no
    ptrace), ``gone`` (no such process), ``missing`` (no executable) or ``error``."""
    try:
        done = subprocess.run([py_spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        return "missing", str(exc)
    except subprocess.TimeoutExpired:
        return "error", f"py-spy dump timed out after {timeout_s:g} s"
    except OSError as exc:
        return ("denied" if isinstance(exc, PermissionError) else "error"), str(exc)
    if done.returncode == 0:
        return "ok", done.stdout
    message = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()[0]
    low = message.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return "denied", message
    if "check that the process is running" in low or "no such process" in low or not _alive(pid):
        return "gone", message
    return "error", message


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class _PidSampler:
    """The thread that dumps one pid at ``hz`` (set from the main thread at any time)."""

    def __init__(self, owner: StackSampler, pid: int, hz: float, dump: Callable[[str, int], tuple[str, str]]):
        self.owner, self.pid, self.hz, self._dump = owner, pid, hz, dump
        self.samples = self.errors = self.dropped = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"argus-stacks-{pid}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def set_rate(self, hz: float) -> None:
        if hz != self.hz:
            self.hz = hz
            self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def join(self, timeout_s: float) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        last = time.monotonic() - 1.0 / self.hz
        failures = 0
        while not self._stop.is_set():
            due = last + (1.0 / self.hz) * (2 ** min(failures, 10))
            if failures:
                due = min(due, last + MAX_BACKOFF_S)
            delay = due - time.monotonic()
            if delay > 0:
                self._wake.wait(delay)
                self._wake.clear()
                continue  # re-evaluate: the rate may have changed, or we are stopping
            last = time.monotonic()
            t0 = time.time_ns()
            kind, text = self._dump(self.owner.py_spy or "py-spy", self.pid)
            ts = (t0 + time.time_ns()) // 2
            if kind == "ok":
                failures = 0
                self.samples += 1
                if not self.owner.put(("sample", self.pid, ts, parse_dump(text, self.pid))):
                    self.dropped += 1
                continue
            self.errors += 1
            failures += 1
            self.owner.put((kind, self.pid, text))
            if kind in ("denied", "gone", "missing"):
                return


@dataclass
class _Run:
    step: int
    frames: str
    start_ns: int
    end_ns: int
    count: int = 1


@dataclass
class _RankState:
    handle: RankHandle
    joined: float
    mode: str = "off"  # py-spy | in-process | shared | off
    durations: deque = field(default_factory=lambda: deque(maxlen=_KEEP_DURATIONS))
    gaps: deque = field(default_factory=lambda: deque(maxlen=_KEEP_DURATIONS))
    last_report: float | None = None  # processor clock of the last finished step received
    last_end_ns: int = -1
    last_finished: int = -1
    pending: deque = field(default_factory=lambda: deque(maxlen=4096))  # (ts_ns, [(thread, frames)])
    runs: dict[str, _Run] = field(default_factory=dict)
    suspicion: Suspicion = field(default_factory=lambda: Suspicion())
    inprocess_hz: float = 0.0
    records: int = 0
    reported_drops: int = 0


@dataclass
class Suspicion:
    """A rank's suspicion episode (see the module docstring for the rule)."""

    reason: str | None = None
    since: float = 0.0
    until: float = 0.0
    capped: bool = False

    def update(self, now: float, condition: str | None, median_s: float) -> str | None:
        if condition is not None:
            if self.reason is None:
                self.since, self.capped = now, False
            self.reason = condition
            self.until = now + max(HOLD_S, 3 * median_s)
        elif self.reason is not None and now >= self.until:
            self.reason, self.capped = None, False
        if self.reason is not None and now - self.since > MAX_SUSPECT_S:
            self.capped = True
        return None if self.capped else self.reason


class StackSampler(Sampler):
    """py-spy sampling of every local rank that said its pid in HELLO."""

    name = "stacks"

    def __init__(self, *, hz: float = 1.0, suspect_hz: float = 10.0, py_spy: str | None = None,
                 dump: Callable[[str, int], tuple[str, str]] = run_dump, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.hz, self.suspect_hz = hz, suspect_hz
        self.requested = py_spy
        self.py_spy: str | None = None
        self.enabled = False
        self.dump = dump
        self.clock = clock
        self.states: dict[int, _RankState] = {}  # token → state
        self.threads: dict[int, _PidSampler] = {}  # pid → sampling thread
        self.owner: dict[int, int] = {}  # pid → token whose rank its stacks are recorded under
        self._controls: list[tuple[RankHandle, dict[str, Any]]] = []
        self._logged: set[tuple[int, str]] = set()
        self._last_judged = 0.0
        self._off_reason = ""

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.py_spy = find_py_spy(self.requested)
        if self.py_spy is None:
            wanted = self.requested or os.environ.get(PY_SPY_ENV) or "py-spy"
            self._off(f"{wanted} not found (install py-spy, or set ${PY_SPY_ENV})")
            return
        self.enabled = True
        for st in self.states.values():
            self._attach(st)

    def _off(self, why: str) -> None:
        self.enabled = False
        self._off_reason = why
        log.warning("stack sampling off: %s", why)
        for t in self.threads.values():
            t.stop()
        for st in self.states.values():
            if st.mode in ("py-spy", "shared"):
                st.mode = "off"

    def close(self) -> list[Output]:
        self.enabled = False
        for t in self.threads.values():
            t.stop()
        for t in self.threads.values():
            t.join(DUMP_TIMEOUT_S + 1)
        return []

    # -- ranks -----------------------------------------------------------------------------
    def rank_joined(self, handle: RankHandle) -> None:
        st = self.states[handle.token] = _RankState(handle=handle, joined=self.clock())
        if self.enabled:
            self._attach(st)

    def _attach(self, st: _RankState) -> None:
        pid = st.handle.pid
        if pid is None or pid <= 0:
            return
        if pid in self.owner:  # one process hosting several ranks: sampled once, under the first
            st.mode = "shared"
            return
        self.owner[pid] = st.handle.token
        st.mode = "py-spy"
        t = self.threads[pid] = _PidSampler(self, pid, self.hz, self.dump)
        t.start()

    def rank_left(self, handle: RankHandle) -> list[Output]:
        st = self.states.pop(handle.token, None)
        if st is None:
            return []
        out = self._emit(st, self._place(st, now_ns=None) + self._flush(st, everything=True))
        pid = handle.pid
        if pid is not None and self.owner.get(pid) == handle.token:
            del self.owner[pid]
            heir = next((s for s in self.states.values() if s.handle.pid == pid and s.mode == "shared"), None)
            if heir is not None and pid in self.threads:
                self.owner[pid] = heir.handle.token
                heir.mode = st.mode
            else:
                t = self.threads.pop(pid, None)
                if t is not None:
                    t.stop()
        return out

    def steps_reported(self, handle: RankHandle, records: np.ndarray) -> None:
        st = self.states.get(handle.token)
        done = records[records["end_ns"] >= 0] if st is not None else records[:0]
        if st is None or not len(done):
            return
        now = self.clock()
        if st.last_report is not None:
            st.gaps.append(now - st.last_report)
        st.last_report = now
        st.durations.extend(((done["end_ns"] - done["start_ns"]) / 1e9).tolist())
        st.last_end_ns = max(st.last_end_ns, int(done["end_ns"].max()))
        st.last_finished = max(st.last_finished, int(done["step"].max()))

    # -- observations from the threads -------------------------------------------------------
    def receive(self, payload: Any, ranks: Iterable[RankHandle]) -> list[Output]:
        kind, pid = payload[0], payload[1]
        st = self.states.get(self.owner.get(pid, -1))
        if kind == "sample":
            if st is not None:
                st.pending.append((payload[2], payload[3]))
            return []
        message = payload[2]
        if kind == "missing":
            if self.enabled:
                self._off(f"{self.py_spy} cannot be run ({message})")
            return []
        if kind in ("denied", "gone"):
            self.threads.pop(pid, None)
        if st is None:
            return []
        if kind == "denied":
            st.mode = "in-process"
            log.warning("py-spy may not trace rank %d (pid %d): %s; asking the rank to sample itself",
                        st.handle.rank, pid, message)
            self._control(st, self._rate(st))
        elif kind == "gone":
            st.mode = "off"
        elif (pid, message) not in self._logged and len(self._logged) < 1000:
            self._logged.add((pid, message))
            log.warning("py-spy cannot sample rank %d (pid %d): %s; retrying with backoff", st.handle.rank, pid,
                        message)
        return []

    def _control(self, st: _RankState, hz: float) -> None:
        st.inprocess_hz = hz
        self._controls.append((st.handle, {"stacks": {"inprocess_hz": hz}}))

    def take_controls(self) -> list[tuple[RankHandle, dict[str, Any]]]:
        out, self._controls = self._controls, []
        return out

    # -- every loop cycle --------------------------------------------------------------------
    def tick(self, now_ns: int) -> list[Output]:
        now = self.clock()
        if now - self._last_judged >= 0.25:
            self._last_judged = now
            self._judge(now)
        out: list[Output] = []
        for st in self.states.values():
            out += self._emit(st, self._place(st, now_ns) + self._flush(st, everything=False, now_ns=now_ns))
            t = self.threads.get(st.handle.pid or -1)
            if t is not None and self.owner.get(t.pid) == st.handle.token and t.dropped > st.reported_drops:
                n, st.reported_drops = t.dropped - st.reported_drops, t.dropped
                drops = np.zeros(1, DTYPES[Msg.DROPS])
                drops[0] = (DROP_TABLES.index("stacks"), n, n)
                out.append((st.handle, Msg.DROPS, drops))
        return out

    def _rate(self, st: _RankState) -> float:
        return self.suspect_hz if st.suspicion.reason is not None and not st.suspicion.capped else self.hz

    def _judge(self, now: float) -> None:
        """Apply the suspicion rule to every rank and set its sampling rate."""
        pooled: dict[tuple[str, str], list[float]] = {}
        for st in self.states.values():
            pooled.setdefault(st.handle.attempt_key, []).extend(st.durations)
        for st in self.states.values():
            durations = pooled[st.handle.attempt_key]
            condition, median = None, 0.0
            if len(durations) >= 3:
                median = float(np.median(durations))
                # until a few report intervals are known, assume the producer's batching (1 s)
                usual_gap = float(np.median(st.gaps)) if len(st.gaps) >= 3 else MIN_REPORT_GAP_S
                silent = now - (st.last_report if st.last_report is not None else st.joined)
                if silent > max(3 * median, 2 * usual_gap, 2 * MIN_REPORT_GAP_S):
                    condition = "stalled"
                elif st.durations and (st.durations[-1] > SLOW_ONE * median or (
                        len(st.durations) >= 5 and float(np.median(list(st.durations)[-5:])) > SLOW_RECENT * median)):
                    condition = "slow"
            st.suspicion.update(now, condition, median)
            hz = self._rate(st)
            if st.mode == "py-spy":
                t = self.threads.get(st.handle.pid or -1)
                if t is not None:
                    t.set_rate(hz)
            elif st.mode == "in-process" and hz != st.inprocess_hz:
                self._control(st, hz)

    def _place(self, st: _RankState, now_ns: int | None) -> list[tuple[str, _Run]]:
        """Give pending samples their step once it is known (``now_ns`` None: place them all);
        returns the runs this ended."""
        ended: list[tuple[str, _Run]] = []
        info = st.handle.info
        while st.pending:
            ts, threads = st.pending[0]
            if now_ns is not None and ts > st.last_end_ns and now_ns - ts < PLACE_GRACE_NS:
                break
            st.pending.popleft()
            i = bisect.bisect_right(info.step_starts, ts) - 1
            step = info.step_ids[i] if i >= 0 else (info.step_ids[0] if info.step_ids else max(info.max_step + 1, 0))
            if st.last_finished >= 0 and ts > st.last_end_ns and step <= st.last_finished:
                step = st.last_finished + 1
            for thread, frames in threads:
                run = st.runs.get(thread)
                if run is not None and run.step == step and run.frames == frames:
                    run.count += 1
                    run.end_ns = ts
                    continue
                if run is not None:
                    ended.append((thread, run))
                st.runs[thread] = _Run(step, frames, ts, ts)
        return ended

    def _flush(self, st: _RankState, everything: bool, now_ns: int = 0) -> list[tuple[str, _Run]]:
        done = [(thread, run) for thread, run in st.runs.items()
                if everything or run.step <= st.last_finished or now_ns - run.start_ns >= RUN_FLUSH_NS]
        for thread, _ in done:
            del st.runs[thread]
        return done

    def _emit(self, st: _RankState, runs: list[tuple[str, _Run]]) -> list[Output]:
        """One batch per rank and cycle (the assembler decodes names per batch)."""
        if not runs:
            return []
        recs = np.zeros(len(runs), DTYPES[Msg.STACKS])
        recs["step"] = [r.step for _, r in runs]
        recs["start_ns"] = [r.start_ns for _, r in runs]
        recs["end_ns"] = [r.end_ns for _, r in runs]
        recs["frames"] = [st.handle.intern(r.frames) for _, r in runs]
        recs["thread"] = [st.handle.intern(t) for t, _ in runs]
        recs["count"] = [r.count for _, r in runs]
        st.records += len(runs)
        return [(st.handle, Msg.STACKS, recs)]

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        ranks = []
        for st in self.states.values():
            t = self.threads.get(st.handle.pid or -1) if st.mode == "py-spy" else None
            ranks.append({"rank": st.handle.rank, "attempt": "/".join(st.handle.attempt_key), "pid": st.handle.pid,
                          "mode": st.mode, "hz": (t.hz if t else st.inprocess_hz if st.mode == "in-process" else 0.0),
                          "suspect": st.suspicion.reason, "capped": st.suspicion.capped,
                          "samples": t.samples if t else 0, "errors": t.errors if t else 0, "records": st.records})
        return {"enabled": self.enabled, "py_spy": self.py_spy, "off_reason": self._off_reason,
                "hz": self.hz, "suspect_hz": self.suspect_hz, "ranks": ranks}

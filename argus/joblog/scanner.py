"""Turn a job's output, as it streams, into timed events with ranks — in bounded memory.

Lines are attributed to a rank by what they carry, since a launcher merges its ranks' output
into one stream:

* ``[rank3]:`` / ``[default3]:`` prefixes (torch.distributed's uncaught-exception hook, a
  launcher's ``--log-line-prefix-template``);
* ``Rank 3`` inside a process group's watchdog line;
* torchrun's failure report: ``rank : 3 (local_rank: 3)`` then ``exitcode : -9 (pid: …)``;
* a pid the caller maps to a rank (``pid_rank``: NCCL's ``host:pid:tid`` prefix).

Anything else is rank -1 (the launcher, or a rank that did not say). An uncaught traceback
becomes one ``exception`` event: its last line, at its innermost frame. Lines no signature
matches are counted per rank, never kept; a line longer than ``MAX_LINE`` is scanned by its
first ``MAX_LINE`` bytes; past ``MAX_EVENTS`` events only counts grow.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

from argus.joblog.ras import RasBehind, RasParser
from argus.joblog.signatures import SIGNATURES, LogKind

__all__ = ["LogEvent", "LogScanner", "MAX_LINE", "MAX_EVENTS"]

MAX_LINE = 64 << 10
MAX_EVENTS = 10_000
MAX_TEXT = 500

# ``[rank12]:`` (torch.distributed's global rank) and ``[default0]:`` (torchrun's tee: the worker
# role, "default", and its LOCAL rank), often both: ``[default0]:[rank12]:[E…] …``
_PREFIX = re.compile(r"^\[([A-Za-z_][\w-]{0,31}?)(\d+)\]:\s?")
# a logger's time stamp before everything else: "2024-11-20 14:37:16 [rank3]: …",
# "[2024-11-26 02:04:28,494] torch.distributed…", "2026-12-06T09:00:00.123Z …"
_STAMP = re.compile(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?\]?\s+")
# torchrun's agent on a worker it lost: "failed (exitcode: -9) local_rank: 3 (pid: 812917) of binary: …"
_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_PG_RANK = re.compile(r"\bRank (\d+)\b")
# NCCL's prefix: ``host:pid:tid [dev] NCCL INFO``; a WARN names its source line too (``[dev] misc/socket.cc:484 NCCL WARN``)
_NCCL_PID = re.compile(r"^[\w.\-]+:(\d+):\d+ \[\d+\] (?:[\w./\-]+:\d+ )?NCCL")
_REPORT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")
_REPORT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
# ProcessGroupNCCL's desync report (TORCH_NCCL_DESYNC_DEBUG): "… the lagging/dead/mismatched ranks
# that caused the desync are: [7] finished collective #182, but didn't join collective #183 …"
# Its lines after "are:" list ranks by state ("   - [47] joined but didn't finish collective #41207");
# a rank that never came: "ranks [47] are the lagging ranks that caused this timeout"
_DESYNC = re.compile(r"ranks that caused the desync are:\s*(.{0,400})")
_DESYNC_RANKS = re.compile(r"^\s*-?\s*\[([\d,\s]{1,2000})\]\s*(.{0,300})")
_DESYNC_NEVER = re.compile(r"ranks \[([\d,\s]{1,2000})\] are the lagging ranks that caused this timeout")
#: lines after the desync report's header that may list its ranks
_DESYNC_LINES = 4
# torchfrtrace (torch/distributed/flight_recorder/fr_trace.py): "Not all ranks joining collective,
# sequence number: 6" (or "… collective 5 at entry 4"), then "group info: 20:EXPERT_…",
# "collective: nccl:_all_gather_base", "missing ranks: {12}"; older: one line, "Missing ranks are {1}"
_FR_HEAD = re.compile(r"Not all ranks joining collective(?:,? sequence number:? (\d+)| (\d+) at entry \d+| for group "
                      r"(\S+) collective (\S+))?")
_FR_FIELD = re.compile(r"^\s*(group info|collective|missing ranks|Missing ranks are):?\s*(.{0,300})")
_FR_ONE_LINE = re.compile(r"Missing ranks are \{([\d,\s]{0,2000})\}")
#: lines after the analyzer's header that may hold its fields
_FR_LINES = 14
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+), in (.+)$')
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_LAUNCHER_EXC = ("ChildFailedError", "SignalException")
# torchrun's agent, its workers done, waits for the other nodes' agents at an exit barrier held in
# the store that node 0's agent serves; when that agent exits first the barrier fails: the store
# client's warning (``[W1206 … TCPStore.cpp:138] [c10d] recvValueWithTimeout failed …: Connection
# reset by peer``), then ``E1206 … api.py:1008] Error waiting on exit barrier. Elapsed: …`` and its
# traceback (under that same logger head, with none, or with a log shipper's stamp; see below).
# The job finished: one ``launcher_exit``, no peer lost.
_EXIT_BARRIER = re.compile(r"^(?P<head>.{0,400}?)Error waiting on exit barrier\b")
_STORE_CLIENT = re.compile(r"^\[[WE]\d{4} \S{1,32} TCPStore\.cpp:\d+\]")
# a traceback's body, also where a log shipper's time stamp took its indentation off (pytorch#69520's
# "2023-03-09T10:53:23.670-05:00\tFile …"), and the exception's line that ends it
_TB_BODY = re.compile(r'^(?:\s|$|File "|During handling|The above exception|Traceback|\^+$)')
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout)\b")
#: at most this many lines of the exit barrier's traceback are read as its own
_EXIT_TB_LINES = 200
#: how long a store client's "connection reset" line waits for the exit barrier's line that explains it
HOLD_NS = 2_000_000_000


def _notable(line: str) -> bool:
    """Whether a line says something of its own (a signature, torchrun's report, a desync or
    Flight Recorder report): never absorbed into a traceback whose indentation a shipper took."""
    return any(sig.pattern.search(line) for sig in SIGNATURES) or any(
        p.search(line) for p in (_AGENT_FAILED, _REPORT_RANK, _REPORT_EXIT, _DESYNC, _FR_HEAD))


@dataclass(frozen=True)
class LogEvent:
    ts_ns: int  # when the line was read (wall clock)
    rank: int  # -1: not known
    stream: str  # "stdout" | "stderr"
    kind: LogKind
    severity: str
    text: str
    pid: int = -1  # the process the line names (NCCL's host:pid:tid), to find its rank later


class _Traceback:
    __slots__ = ("frame",)

    def __init__(self) -> None:
        self.frame = ""


class LogScanner:
    """Thread-safe: each stream feeds from its own thread."""

    def __init__(self, pid_rank: Callable[[int], int | None] | None = None,
                 clock: Callable[[], int] = time.time_ns, max_events: int = MAX_EVENTS,
                 local_offset: int | None = None):
        """``local_offset``: the global rank of local rank 0 on this node, where the launch says it
        (``launch.local_rank_offset``); None: a ``[default3]`` line's rank is not known, its local
        rank is kept in the text (a multi-node log's ``[default0]`` is local rank 0 of every node)."""
        self.pid_rank = pid_rank
        self.local_offset = local_offset
        self._note = ""  # the line's unmapped local rank, said in its event's text
        self.clock = clock
        self.max_events = max_events
        self._lock = threading.Lock()
        self._partial: dict[str, bytearray] = {}
        self._tracebacks: dict[tuple[str, int], _Traceback] = {}
        self._report_rank: int | None = None
        self._desync_after: dict[tuple[str, int], int] = {}  # lines left that may list a desync's ranks
        self._ras: dict[str, RasParser] = {}  # per stream: NCCL RAS reports
        self._fr: dict[str, dict] = {}  # per stream: the torchfrtrace block being read
        self.pending: list[LogEvent] = []  # not yet taken by the caller
        self._held: dict[str, LogEvent] = {}  # per stream: a store client's lost connection (``HOLD_NS``)
        self._exit_head: dict[str, tuple[str, bool, int]] = {}  # per stream: the exit barrier's head, in its traceback, lines
        self.events = 0
        self.dropped = 0  # events past max_events
        self.other: dict[tuple[int, str], int] = {}  # (rank, stream) → lines no signature matched

    def feed(self, stream: str, data: bytes) -> None:
        """Bytes as read from ``stream``; complete lines are scanned, the rest kept (bounded)."""
        with self._lock:
            buf = self._partial.setdefault(stream, bytearray())
            start = 0
            while True:
                nl = data.find(b"\n", start)
                if nl < 0:
                    room = MAX_LINE - len(buf)
                    if room > 0:
                        buf += data[start:start + room]
                    return
                room = MAX_LINE - len(buf)
                if room > 0:
                    buf += data[start:min(nl, start + room)]
                self._line(stream, buf.decode("utf-8", "replace").rstrip("\r"))
                buf.clear()
                start = nl + 1

    def close(self) -> None:
        """Scan what is left without a newline (the job's last words)."""
        with self._lock:
            for stream, buf in self._partial.items():
                if buf:
                    self._line(stream, buf.decode("utf-8", "replace").rstrip("\r"))
                    buf.clear()
            for (stream, rank), _tb in list(self._tracebacks.items()):
                del self._tracebacks[(stream, rank)]
            for stream, ras in self._ras.items():
                self._ras_behind(stream, ras.close())
            for stream in list(self._held):
                self._release(stream)

    def take(self) -> tuple[list[LogEvent], dict[tuple[int, str], int]]:
        """The events and unmatched-line counts since the last call."""
        with self._lock:
            now = self.clock()
            for stream, e in list(self._held.items()):
                if now - e.ts_ns >= HOLD_NS:
                    self._release(stream)
            events, self.pending = self.pending, []
            other, self.other = self.other, {}
        return events, other

    # -- one line (under the lock) ------------------------------------------------------------
    def _emit(self, rank: int, stream: str, kind: LogKind, severity: str, text: str, pid: int = -1) -> None:
        self._release(stream)  # a held line first, in the order read
        self._append(LogEvent(self.clock(), rank, stream, kind, severity, (self._note + text)[:MAX_TEXT], pid))

    def _append(self, event: LogEvent) -> None:
        if self.events >= self.max_events:
            self.dropped += 1
            return
        self.events += 1
        self.pending.append(event)

    def _release(self, stream: str) -> None:
        held = self._held.pop(stream, None)
        if held is not None:
            self._append(held)

    def _launcher_exit(self, stream: str, rank: int, line: str) -> bool:
        """Whether ``line`` is the launcher's failed exit barrier, or a line of the traceback
        logged with it (under the same logger head, if the logger writes one)."""
        state = self._exit_head.get(stream)
        if state is not None:
            head, in_tb, lines = state
            if not in_tb and not line.startswith(head) and line.startswith("Traceback (most recent call last):"):
                head = ""  # a logger that heads its message only, not the traceback's lines
            rest = line[len(head):] if line.startswith(head) else None
            if rest is not None and (rest.startswith("Traceback (most recent call last):") or in_tb):
                ends = in_tb and _EXCEPTION_LINE.match(rest) is not None
                if not ends and in_tb and not _TB_BODY.match(rest) and (
                        lines >= _EXIT_TB_LINES or _notable(rest)):
                    del self._exit_head[stream]  # not the traceback's: a line of its own, read as such
                    return False
                if ends:  # the exception's line: the traceback is over
                    del self._exit_head[stream]
                else:
                    self._exit_head[stream] = (head, True, lines + 1)
                self.other[(rank, stream)] = self.other.get((rank, stream), 0) + 1
                return True
            del self._exit_head[stream]
        m = _EXIT_BARRIER.match(line) if rank < 0 and "exit barrier" in line else None
        if m is None:
            return False
        lost = self._held.pop(stream, None)  # the store client's side of the same failure
        self._exit_head[stream] = (m.group("head"), False, 0)
        self._emit(rank, stream, LogKind.LAUNCHER_EXIT, "info",
                   "torchrun's agent could not meet the other nodes' agents at its exit barrier after its workers "
                   f"finished{' (its store connection closed)' if lost else ''}: {line.strip()}")
        return True

    def _rank_of(self, line: str) -> tuple[int, str]:
        self._note = ""  # each line's own: a [rankN] line after a [defaultN] one says no local rank
        stamp = _STAMP.match(line)
        if stamp:
            line = line[stamp.end():]
        rank = local = None
        while (m := _PREFIX.match(line)) is not None:
            if m.group(1) == "rank":
                rank = int(m.group(2))
            elif local is None:
                local = int(m.group(2))
            line = line[m.end():]
        if rank is not None:
            return rank, line
        if local is not None:
            if self.local_offset is not None:
                return self.local_offset + local, line
            self._note = f"[local rank {local}] "  # the node's, not the job's: kept as such in the text
        return self._unprefixed(line)

    def _unprefixed(self, line: str) -> tuple[int, str]:
        m = _NCCL_PID.match(line)
        if m and self.pid_rank is not None:
            r = self.pid_rank(int(m.group(1)))
            if r is not None:
                return r, line
        if "PG" in line or "ProcessGroup" in line:
            m = _PG_RANK.search(line)
            if m:
                return int(m.group(1)), line
        return -1, line

    def _line(self, stream: str, raw: str) -> None:
        rank, line = self._rank_of(raw)
        if self._launcher_exit(stream, rank, line) or self._traceback(stream, rank, line):
            return
        m = _AGENT_FAILED.search(line)
        if m:  # the agent names the worker by its local rank: global only where the launch says
            code, local, pid = int(m.group(1)), int(m.group(2)), m.group(3)
            r = self.local_offset + local if self.local_offset is not None else -1
            who = f"rank {r}" if r >= 0 else f"local rank {local}"
            if code < 0:
                self._emit(r, stream, LogKind.KILLED, "error", f"{who} (pid {pid}) ended by signal {-code} "
                                                               f"({_SIGNALS.get(-code, 'signal')})")
            else:
                self._emit(r, stream, LogKind.WORKER_FAILED, "error", f"{who} (pid {pid}) exited with code {code}")
            return
        m = _REPORT_RANK.match(line)
        if m:
            self._report_rank = int(m.group(1))
            self.other[(-1, stream)] = self.other.get((-1, stream), 0) + 1
            return
        m = _REPORT_EXIT.match(line)
        if m and self._report_rank is not None:
            code, pid = int(m.group(1)), m.group(2)
            if code in (-15, -2):  # the launcher stopping the others after one failed
                self._emit(self._report_rank, stream, LogKind.STOPPED, "info",
                           f"rank {self._report_rank} (pid {pid}) stopped by the launcher ({_SIGNALS[-code]})")
            elif code < 0:
                self._emit(self._report_rank, stream, LogKind.KILLED, "error",
                           f"rank {self._report_rank} (pid {pid}) ended by signal {-code} "
                           f"({_SIGNALS.get(-code, 'signal')})")
            else:
                self._emit(self._report_rank, stream, LogKind.WORKER_FAILED, "error",
                           f"rank {self._report_rank} (pid {pid}) exited with code {code}")
            self._report_rank = None
            return
        if self._desync_report(stream, rank, line) or self._fr_trace(stream, line):
            return
        behind, taken = self._ras.setdefault(stream, RasParser()).feed(line)
        self._ras_behind(stream, behind)
        if taken:
            return
        for sig in SIGNATURES:
            if sig.pattern.search(line):
                if sig.kind == LogKind.PEER_LOST and rank < 0 and _STORE_CLIENT.match(line):
                    # a store client's lost connection: held a moment, in case the launcher's exit
                    # barrier says next that it is only its teardown
                    self._release(stream)
                    self._held[stream] = LogEvent(self.clock(), rank, stream, sig.kind, sig.severity,
                                                  (self._note + line.strip())[:MAX_TEXT])
                    return
                m = _NCCL_PID.match(line) if rank < 0 else None
                self._emit(rank, stream, sig.kind, sig.severity, line.strip(), int(m.group(1)) if m else -1)
                return
        self.other[(rank, stream)] = self.other.get((rank, stream), 0) + 1

    def _fr_trace(self, stream: str, line: str) -> bool:
        """torchfrtrace's "Not all ranks joining collective" blocks: an ``fr_missing`` event per
        missing rank, once the block names them."""
        m = _FR_HEAD.search(line)
        if m:
            seq = m.group(1) or m.group(2) or ""
            self._fr[stream] = {"left": _FR_LINES, "seq": seq, "group": m.group(3) or "", "op": m.group(4) or ""}
            one = _FR_ONE_LINE.search(line)
            if one:
                self._fr_missing(stream, one.group(1))
            return True
        block = self._fr.get(stream)
        if block is None:
            return False
        block["left"] -= 1
        if block["left"] <= 0:
            del self._fr[stream]
            return False
        f = _FR_FIELD.match(line)
        if f is None:
            return False
        name, value = f.group(1), f.group(2).strip()
        if name == "group info":
            block["group"] = value
        elif name == "collective":
            block["op"] = value
        else:
            self._fr_missing(stream, value.strip("{}"))
        return True

    def _fr_missing(self, stream: str, ranks: str) -> None:
        block = self._fr.pop(stream, {})
        named = sorted({int(x) for x in re.findall(r"\d+", ranks)})[:64]
        group = block.get("group", "")
        what = f"{block.get('op') or 'a collective'}{' #' + block['seq'] if block.get('seq') else ''}" \
               f"{' of group ' + group if group else ''}"
        for r in named:
            self._emit(r, stream, LogKind.FR_MISSING, "error",
                       f"torchfrtrace: ranks {named} missing from {what}")

    def _ras_behind(self, stream: str, behind: list[RasBehind]) -> None:
        for b in behind:
            who = f"rank {b.rank}" if b.rank >= 0 else f"communicator rank {b.comm_rank}"
            self._emit(b.rank, stream, LogKind.RAS_BEHIND, "warning",
                       f"NCCL RAS: {who}{' on node ' + b.node if b.node else ''} has launched up to {b.op} operation "
                       f"{b.at} of communicator {b.comm}; {b.n_ahead} rank{'s' * (b.n_ahead != 1)} up to {b.ahead}")

    def _desync_report(self, stream: str, rank: int, line: str) -> bool:
        """PyTorch's desync report: one ``desync`` event per rank it names (the culprits; the rank
        that printed it only waited for them), from its header line or the few lines after it."""
        key = (stream, rank)
        m = _DESYNC.search(line)
        if m:
            self._desync_after[key] = _DESYNC_LINES
            listed = _DESYNC_RANKS.match(m.group(1))
            if listed:
                self._desync(stream, rank, listed)
            return True
        m = _DESYNC_NEVER.search(line)
        if m:
            self._desync(stream, rank, m, "never joined any collective")
            return True
        left = self._desync_after.get(key, 0)
        if left <= 0:
            return False
        self._desync_after[key] = left - 1
        listed = _DESYNC_RANKS.match(line)
        if listed is None or "..." in listed.group(0):
            return False  # the report's other lines (its snapshot of every rank), or an elided list
        self._desync(stream, rank, listed)
        return True

    def _desync(self, stream: str, rank: int, m: re.Match, what: str | None = None) -> None:
        named = sorted({int(x) for x in re.findall(r"\d+", m.group(1))})[:64]
        said = what or m.group(2).strip()
        by = f" (printed by rank {rank})" if rank >= 0 else ""
        for r in named:
            self._emit(r, stream, LogKind.DESYNC, "error", f"PyTorch's desync report{by}: ranks {named} {said}")

    def _traceback(self, stream: str, rank: int, line: str) -> bool:
        """Whether ``line`` belongs to an uncaught traceback (its last line becomes the event)."""
        key = (stream, rank)
        tb = self._tracebacks.get(key)
        if line.startswith("Traceback (most recent call last):"):
            self._tracebacks[key] = _Traceback()
            return True
        if tb is None:
            return False
        if not line.strip() or line[:1] in (" ", "\t") or line.startswith(("During handling", "The above exception")):
            m = _FRAME.match(line)
            if m and "<frozen " not in m.group(1):
                tb.frame = f"{m.group(3)} ({m.group(1)}:{m.group(2)})"
            return True
        del self._tracebacks[key]
        if line.split(":", 1)[0].rsplit(".", 1)[-1] in _LAUNCHER_EXC:
            self.other[(rank, stream)] = self.other.get((rank, stream), 0) + 1
            return True  # the launcher's own report of a rank's failure (its exit code says it)
        kind, severity = LogKind.EXCEPTION, "error"
        for sig in SIGNATURES:  # an OOM or CUDA error raised as an exception keeps its kind
            if sig.pattern.search(line):
                kind, severity = sig.kind, sig.severity
                break
        self._emit(rank, stream, kind, severity, f"{line.strip()}{' at ' + tb.frame if tb.frame else ''}")
        return True

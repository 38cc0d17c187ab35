"""NCCL's RAS status report (``ncclras``, NCCL 2.24+): which ranks are behind on a communicator's
collective count — read line by line, as it reaches a log.

The report lists its communicator groups in a table, then, for a communicator whose ranks
disagree, a block::

    #0-0 (78db921d1c117b4a) MISMATCH
      Communicator ranks have different AllReduce operation counts
      7 ranks have launched up to operation 64
      Rank 7 has launched up to operation 60 -- GPU 3 managed by process 1650386 on node node1

(outlier groups of several ranks: ``N ranks have launched up to operation V`` followed by their
``Rank R -- GPU … on node H`` lines). The ranks listed at the lowest count are behind. A rank in
the report is the *communicator's* rank: the job's only where the communicator spans the job (its
group holds one communicator of every rank in the table), else it is kept as the communicator's,
with its node. One such report is a snapshot — collectives outpace the query, a spread of one
operation is normal on a healthy job — so it is evidence, not a verdict of its own."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["RasParser", "RasBehind"]

_TABLE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+[A-Z]+\s+[A-Z]+\s*$")
_BLOCK = re.compile(r"^\s*#(\d+)-(\d+) \(([0-9a-fA-F]{1,32})\) ([A-Z]+)\s*$")
_GROUP = re.compile(r"^\s*(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)")
_MEMBER = re.compile(r"^\s*Rank (\d+) -- .*?on node (\S+)\s*$")
_SINGLE = re.compile(r"^\s*Rank (\d+) has (?:launched up to operation (\d+)|not launched any operations)"
                     r"(?: -- .*?on node (\S+))?")
_KIND = re.compile(r"different (\w+) operation counts")
MAX_LISTED = 64


@dataclass(frozen=True)
class RasBehind:
    rank: int  # the job's rank, or -1 where the communicator does not span the job
    comm_rank: int
    node: str
    comm: str  # "#0-0 (78db921d1c117b4a)"
    at: int  # the operation it launched up to
    ahead: int  # … and the most other ranks launched
    n_ahead: int
    op: str  # "AllReduce", "collective"


@dataclass
class _Block:
    group: int
    comm: str
    op: str = "collective"
    groups: list[tuple[int, int, list[tuple[int, str]]]] = field(default_factory=list)  # (value, count, members)


class RasParser:
    """Fed one line at a time; returns the ranks behind when a mismatch block ends."""

    def __init__(self) -> None:
        self._world_groups: set[int] = set()  # groups whose one communicator spans the job
        self._table: list[tuple[int, int, int]] = []  # (group, comms in group, ranks per comm)
        self._block: _Block | None = None

    def feed(self, line: str) -> tuple[list[RasBehind], bool]:
        """The ranks found behind as of this line (when a mismatch block ends), and whether the
        line was the report's."""
        m = _TABLE_ROW.match(line)
        if m:
            self._table.append((int(m.group(1)), int(m.group(2)), int(m.group(5))))
            biggest = max(r for _, _, r in self._table)
            self._world_groups = {g for g, comms, ranks in self._table if comms == 1 and ranks == biggest}
            return [], True
        m = _BLOCK.match(line)
        if m:
            done = self._end()
            self._block = _Block(int(m.group(1)), f"#{m.group(1)}-{m.group(2)} ({m.group(3)})") \
                if m.group(4) == "MISMATCH" else None
            return done, True
        b = self._block
        if b is None:
            return [], False
        if not line.strip():
            return self._end(), True
        if (k := _KIND.search(line)) is not None:
            b.op = k.group(1)
        elif (g := _GROUP.match(line)) is not None:
            b.groups.append((int(g.group(2) or 0), int(g.group(1)), []))
        elif (s := _SINGLE.match(line)) is not None:
            b.groups.append((int(s.group(2) or 0), 1, [(int(s.group(1)), s.group(3) or "")]))
        elif (r := _MEMBER.match(line)) is not None and b.groups:
            members = b.groups[-1][2]
            if len(members) < MAX_LISTED:
                members.append((int(r.group(1)), r.group(2)))
        else:
            return self._end(), False  # the block is over; this line is someone else's
        return [], True

    def close(self) -> list[RasBehind]:
        """A block the input ended in."""
        return self._end()

    def _end(self) -> list[RasBehind]:
        b, self._block = self._block, None
        if b is None or len(b.groups) < 2:
            return []
        top = max(v for v, _, _ in b.groups)
        n_top = sum(n for v, n, _ in b.groups if v == top)
        low = min(v for v, _, _ in b.groups)
        world = b.group in self._world_groups
        return [RasBehind(r if world else -1, r, node, b.comm, v, top, n_top, b.op)
                for v, _, members in b.groups if v == low < top for r, node in members]

"""What each drill does to a rank, and what Argus must say about it to pass."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["DrillKind", "Expectation", "EXPECT"]


class DrillKind(StrEnum):
    KILL_RANK = "kill-rank"  # SIGKILL one rank
    STALL_RANK = "stall-rank"  # SIGSTOP one rank for --duration seconds, then SIGCONT
    SLOW_RANK = "slow-rank"  # one rank stopped most of every 100 ms from then on (a CPU limit)
    HANG = "hang"  # one rank stopped for good: the others block in their next collective
    PROCESSOR = "processor"  # SIGKILL this host's processor
    LINK = "link"  # throttle one host's network link (tc tbf) mid-job: a multi-host job on namespaces


@dataclass(frozen=True)
class Expectation:
    classes: tuple[str, ...]  # incident classes that name this fault
    culprit: bool  # the incident must name the drilled rank
    what: str  # what the drill proves, for the docs and the table


EXPECT: dict[DrillKind, Expectation] = {
    DrillKind.KILL_RANK: Expectation(("fail_stop", "hang"), True,
                                     "a rank that dies is named, confirmed, from its own exit"),
    DrillKind.STALL_RANK: Expectation(("host_stall", "compute_straggler", "hang"), True,
                                      "a rank frozen for seconds is named, not its waiting peers"),
    DrillKind.SLOW_RANK: Expectation(("compute_straggler", "host_stall"), True,
                                     "a rank throttled from then on is the straggler, not the network"),
    DrillKind.HANG: Expectation(("hang",), True, "a rank that stops is caught live, and is the culprit"),
    DrillKind.PROCESSOR: Expectation((), False,
                                     "a host whose processor dies is reported by argus run (and paged, with "
                                     "the absence rules), never silently lost"),
    DrillKind.LINK: Expectation(("link_degradation",), True,
                                "a host whose link slows mid-job is named by its transfers, not its peers or stage"),
}

"""PyTorch Flight Recorder dumps: read them safely, find the stuck collectives and who never came.

``read_dumps`` → ``DumpSet`` (typed per-rank records, decoded by an unpickler that builds plain
data only) → ``stuck_collectives`` → ``hang_incidents`` (the diagnosis' ``Incident``)."""

from argus.flight_recorder.dumps import DumpSet, Entry, Frame, GroupStatus, RankDump, read_dump, read_dumps
from argus.flight_recorder.plain import FlightRecorderError, load_plain
from argus.flight_recorder.stored import hang_step, keep_dumps, with_kept_dumps
from argus.flight_recorder.stuck import StuckCollective, hang_incidents, stuck_collectives

__all__ = ["DumpSet", "Entry", "Frame", "GroupStatus", "RankDump", "read_dump", "read_dumps", "FlightRecorderError",
           "load_plain", "StuckCollective", "hang_incidents", "stuck_collectives", "hang_step", "keep_dumps",
           "with_kept_dumps"]

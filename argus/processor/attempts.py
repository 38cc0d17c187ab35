"""What the processor holds per run attempt it serves: the window assembler, the rank
table, and the attempt's exporters (its store partition, its Perfetto evidence)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from argus.ingest import ClosedWindow, EvidenceExporter, RankPlace, StoreExporter
from argus.processor.assembler import WindowAssembler
from argus.processor.config import ProcessorConfig
from argus.store import Attempt, AttemptWriter
from argus.topology import Layout, Topology

__all__ = ["AttemptKey", "AttemptState", "partitions"]

AttemptKey = tuple[str, str]  # (run id, attempt id)


@dataclass
class AttemptState:
    attempt: Attempt
    assembler: WindowAssembler
    store: StoreExporter
    topology: Topology
    evidence: EvidenceExporter | None = None
    new_ranks: list[int] = field(default_factory=list)  # joined since the last closed window
    in_flight: int = 0  # windows handed to the writer and not yet done
    idle_since: float | None = None  # monotonic time it last had nothing: no rank, window or write

    @classmethod
    def open(cls, attempt: Attempt, layout: Layout, config: ProcessorConfig) -> AttemptState:
        world = layout.world_size
        topology = Topology(layout=layout, hosts=np.full(world, "unknown", dtype=object),
                            local_ranks=np.full(world, -1), gpu_uuids=np.full(world, "", dtype=object))
        evidence = None
        if config.evidence:
            evidence = EvidenceExporter(attempt, topology, config.host, interval_s=config.evidence_interval_s,
                                        max_bytes=config.evidence_max_bytes, max_age_s=config.evidence_max_age_s)
        return cls(attempt=attempt,
                   assembler=WindowAssembler(config.window_steps, config.window_timeout_s, config.max_buffered_events,
                                             host=config.host),
                   store=StoreExporter(attempt, config.host, raw_kernels=config.raw_kernels, durable=config.durable),
                   topology=topology, evidence=evidence)

    def close_window(self, index: int, host: str) -> ClosedWindow:
        """Take window ``index`` out of the assembler as the pipeline's record, with the
        topology rows of the ranks that joined since the last one."""
        data, ranks = self.assembler.take(index)
        topology_rows = None
        if self.new_ranks:
            topology_rows = self.topology.rows(np.array(sorted(set(self.new_ranks)), dtype=np.int64))
            self.new_ranks.clear()
        topo = self.topology
        places = {int(r): RankPlace(str(topo.hosts[r]), int(topo.local_ranks[r]), str(topo.gpu_uuids[r]))
                  for r in ranks}
        return ClosedWindow(run=self.attempt.identity, host=host, layout=self.attempt.layout, data=data,
                            ranks=places, topology_rows=topology_rows)


def partitions(attempts: Mapping[AttemptKey, AttemptState]) -> dict[AttemptKey, AttemptWriter]:
    """The store partition of every attempt served now (where TSDB drops are recorded)."""
    return {key: st.store.partition for key, st in attempts.items()}

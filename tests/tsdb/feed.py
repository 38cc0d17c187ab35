"""Stream a simulated job into a real processor over its socket (what ranks would send)."""

from __future__ import annotations

import os

import numpy as np

from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import DTYPES
from argus.sim.feed import engine_interner, step_batches
from argus.sim.records import StepRecords


class Feeder:
    """One client per rank, created at the first step (HELLO carries the simulated topology)."""

    def __init__(self, sock, run_id: str, layout, topology):
        self.sock, self.run_id, self.layout, self.topology = sock, run_id, layout, topology
        self.clients: dict[int, ProcessorClient] = {}

    def _connect(self, rec: StepRecords) -> None:
        for rank in range(self.layout.world_size):
            c = ProcessorClient(self.sock, {
                "run_id": self.run_id, "attempt_id": "0", "rank": rank, "world_size": self.layout.world_size,
                "host": str(self.topology.hosts[rank]), "local_rank": int(self.topology.local_ranks[rank]),
                "gpu_uuid": str(self.topology.gpu_uuids[rank]), "layout": str(self.layout),
                "order": self.layout.order_str, "pid": os.getpid()})
            c.names = engine_interner(rec.names)
            self.clients[rank] = c.connect(retries=50)

    def step(self, rec: StepRecords) -> None:
        if not self.clients:
            self._connect(rec)
        batches = step_batches(rec)
        hw = rec.hw
        for rank, client in self.clients.items():
            for msg in (Msg.PHASES, Msg.KERNELS, Msg.STEPS):
                if msg in batches.get(rank, {}):
                    client.send(msg, batches[rank][msg])
        if hw is not None and hw.num_rows:
            ranks = hw.column("rank").to_numpy()
            ts, value = hw.column("ts_ns").to_numpy(), hw.column("value").to_numpy()
            metric = np.asarray(hw.column("metric").to_pylist(), object)
            for rank, client in self.clients.items():
                m = ranks == rank
                if m.any():
                    rows = np.zeros(int(m.sum()), DTYPES[Msg.HW])
                    rows["ts_ns"], rows["value"] = ts[m], value[m]
                    rows["metric"] = client.names.ids_of(metric[m])
                    client.send(Msg.HW, rows)

    def close(self) -> None:
        for c in self.clients.values():
            c.flush(1)
        for c in self.clients.values():
            c.wait_for_ack(lambda a: a.get("seq") == 1, timeout_s=60)
        for c in self.clients.values():
            c.close()

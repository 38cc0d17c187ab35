"""A rank's FLUSH closes its attempt's windows with what every rank had sent before it.

The race this pins (seen once in CI as a fifth window from a 4-window job): the loop reads
rank 0's FLUSH in a round whose ``select`` came before rank 1's last batch reached the
socket, though rank 1 sent it first. Closing at once wrote the window without that batch,
and the batch then opened the same window again: two partial copies of one window.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow.compute as pc

from argus.processor import Processor, ProcessorConfig
from argus.store import Store
from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import DTYPES
from tests.processor.test_admission import _wait_for
from tests.shortdir import short_dir


def _steps(*steps: int) -> np.ndarray:
    rec = np.zeros(len(steps), DTYPES[Msg.STEPS])
    rec["step"] = steps
    rec["start_ns"] = [s * 1000 for s in steps]
    rec["end_ns"] = rec["start_ns"] + 900
    return rec


def test_a_flush_waits_for_what_other_ranks_sent_before_it(tmp_path):
    sock = short_dir("argus-f-") / "p.sock"  # unix socket paths cap at 108 bytes
    proc = Processor(ProcessorConfig(store=tmp_path / "store", socket_path=sock, host="node-0", durable=False,
                                     evidence=False, stacks=False, host_counters=False, hw_interval_s=3600,
                                     window_steps=4))
    held = threading.Event()
    select = proc._connections._sel.select

    def ordered_select(timeout=None):
        """The OS's word on which sockets are ready, less rank 1's while ``held``: the round
        in which rank 1's batch arrives just after ``select`` returned."""
        got = select(timeout)
        if held.is_set():
            got = [(k, ev) for k, ev in got if not (getattr(k.data, "info", None) and k.data.info.rank == 1)]
            if not got:
                time.sleep(0.005)
        return got

    proc._connections._sel.select = ordered_select
    loop = threading.Thread(target=proc.serve_forever, daemon=True)
    loop.start()
    _wait_for(sock.exists)
    a, b = (ProcessorClient(sock, {"run_id": "flush", "attempt_id": "0", "rank": r, "world_size": 2,
                                   "pid": os.getpid()}).connect() for r in (0, 1))
    try:
        _wait_for(lambda: len([c for c in proc._conns.values() if c.info is not None]) == 2)
        held.set()
        b.send(Msg.STEPS, _steps(0, 1, 2))  # sent first …
        a.send(Msg.STEPS, _steps(0, 1, 2))
        a.flush(1)  # … but the loop sees rank 0's FLUSH first
        assert a.wait_for_ack(lambda ack: ack.get("seq") == 1, timeout_s=20) == {"seq": 1}
        held.clear()
        b.flush(2)
        assert b.wait_for_ack(lambda ack: ack.get("seq") == 2, timeout_s=20) == {"seq": 2}
    finally:
        a.close()
        b.close()
        proc.stop()
        loop.join(timeout=30)
    assert proc.status.windows_written == 1  # one window, not a copy per rank
    steps = Store.open(tmp_path / "store").attempt().read("steps")
    assert sorted(pc.unique(steps.column("rank")).to_pylist()) == [0, 1] and steps.num_rows == 6

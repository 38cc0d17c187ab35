"""A hang the watch finds: a snapshot attempt, and the job's ranks here asked for their Flight
Recorder (other jobs' ranks are not); a failing check or write never ends the loop."""

from __future__ import annotations

import json
import types

from argus.processor.config import ProcessorConfig
from argus.processor.attempts import AttemptState
from argus.processor.hang_patrol import HangPatrol
from argus.processor.hangs import HangConfig
from argus.processor.rings import Rings
from argus.processor.status import ProcessorStatus
from argus.store import Store
from argus.topology import RunIdentity, parse_layout
from argus.wire import FrameReader


def _conn(key, rank):
    return types.SimpleNamespace(attempt_key=key, info=types.SimpleNamespace(rank=rank), ring=None)


def test_a_hang_asks_the_jobs_ranks_for_their_flight_recorder(tmp_path):
    status = ProcessorStatus()
    rings = Rings(status, records=lambda *a: None, note_drop=lambda *a: None)
    patrol = HangPatrol(HangConfig(), "node-0", None, rings, status)
    layout = parse_layout("dp=2", world_size=2)
    attempt = Store.create(tmp_path / "s").open_or_create_attempt(RunIdentity("job", "0"), layout, source="processor")
    st = AttemptState.open(attempt, layout, ProcessorConfig(store=tmp_path / "s", socket_path=tmp_path / "p.sock",
                                                            host="node-0", evidence=False))
    key = ("job", "0")
    patrol.watch.check = lambda views: {key: {}}  # a hang; its (empty) snapshot cannot be written
    sent = []
    conns = [_conn(key, 0), _conn(key, 1), _conn(("other", "0"), 0)]
    patrol.check(conns, {key: st}, lambda conn, frame: sent.append((conn.info.rank, frame)))
    assert [rank for rank, _ in sent] == [0, 1] and status.flight_recorder_asked == 2
    reader = FrameReader()
    reader.feed(sent[0][1])
    (msg, payload), = list(reader.frames())
    assert json.loads(payload)["flight_recorder"]["dir"].startswith(str(attempt.path))
    assert status.hang_snapshots == 0  # the write failed: logged, counted nowhere else, loop goes on

    def broken(views):
        raise ValueError("a ring truncated under us")

    patrol.watch.check = broken
    patrol._next_check = 0.0
    patrol.check(conns, {key: st}, lambda conn, frame: None)
    assert status.hang_check_errors == 1

"""NCCL's RAS status report, transcribed in the format of NCCL's RAS documentation and client
(``src/ras/client_support.cc``): which ranks are behind, job ranks or communicator ranks."""

from __future__ import annotations

import io

from argus.joblog import LogScanner
from argus.joblog.offline import log_incidents, read_logs

TABLE = """Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         2         4         8         8   RUNNING  MISMATCH

Errors
======


Warnings
========

"""
ONE_BEHIND = """#0-0 (78db921d1c117b4a) MISMATCH
  Communicator ranks have different AllReduce operation counts
  7 ranks have launched up to operation 64
  Rank 7 has launched up to operation 60 -- GPU 3 managed by process 1650386 on node node1

"""
SIX_BEHIND = """#0-0 (27a079b828ff1a75) MISMATCH
  Communicator ranks have different collective operation counts
  26 ranks have launched up to operation 6650
  6 ranks have launched up to operation 6649
""" + "".join(f"  Rank {r} -- GPU {r} managed by process {483072 + r} on node 172.16.64.210\n" for r in (0, 2, 3, 4, 5, 7))


def _events(text: str):
    s = LogScanner()
    s.feed("log", text.encode())
    s.close()
    return s.take()[0]


def test_the_rank_behind_is_named_with_its_node_and_counts():
    (e,) = _events(TABLE + ONE_BEHIND)
    assert (e.rank, str(e.kind)) == (7, "ras_behind")
    assert e.text == ("NCCL RAS: rank 7 on node node1 has launched up to AllReduce operation 60 of communicator "
                      "#0-0 (78db921d1c117b4a); 7 ranks up to 64")


def test_an_outlier_group_lists_its_ranks_and_a_report_that_ends_the_input_is_read():
    table = TABLE.replace("2         4         8         8", "4         8        32        32")
    assert [e.rank for e in _events(table + SIX_BEHIND.rstrip("\n"))] == [0, 2, 3, 4, 5, 7]


def test_a_communicator_of_part_of_the_job_keeps_its_own_ranks():
    table = TABLE.replace("    0         1         2         4         8         8   RUNNING  MISMATCH",
                          "    0         1         2         4         8         8   RUNNING  OK\n"
                          "    1         4         1         2         2         8   RUNNING  MISMATCH")
    (e,) = _events(table + ONE_BEHIND.replace("#0-0", "#1-2"))
    assert e.rank == -1 and e.text.startswith("NCCL RAS: communicator rank 7 on node node1")


def test_one_report_is_evidence_two_alike_are_a_suspected_hang():
    read = read_logs([("ras", io.BytesIO((TABLE + ONE_BEHIND).encode()))])
    assert log_incidents(read)[0] == []  # a snapshot: collectives outpace the query
    read = read_logs([("ras", io.BytesIO((TABLE + ONE_BEHIND + TABLE + ONE_BEHIND).encode()))])
    (inc,) = log_incidents(read)[0]
    assert (inc.klass, inc.culprit_ranks, inc.state) == ("hang", [7], "suspected")
    assert "NCCL's RAS report, twice" in inc.summary

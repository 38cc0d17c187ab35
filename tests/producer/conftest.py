"""Read what an in-process producer wrote into its ring, as the processor would."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from argus.wire import DTYPES, Msg, RingReader
from tests.shortdir import short_dir


class RingView:
    """Everything the runtime ``rt`` recorded so far: record arrays and the name table."""

    def __init__(self, rt):
        self.rt = rt
        self.reader = RingReader(rt.ring.path, expect_pid=os.getpid())
        self.names: list[str] = []
        self.tables = {m: np.zeros(0, DTYPES[m]) for m in (Msg.STEPS, Msg.PHASES, Msg.KERNELS, Msg.STACKS,
                                                                  Msg.CHECKS)}

    def read(self) -> "RingView":
        self.rt.ring.settle()
        self.names += self.reader.new_names()
        for msg, recs in self.reader.drain(settled=False).items():
            self.tables[msg] = np.concatenate([self.tables[msg], recs])
        return self

    @property
    def steps(self):
        return self.read().tables[Msg.STEPS]

    @property
    def phases(self):
        return self.read().tables[Msg.PHASES]

    @property
    def kernels(self):
        return self.read().tables[Msg.KERNELS]

    def phase_names(self) -> list[str]:
        return [self.names[i] for i in self.phases["name"]]


@pytest.fixture()
def no_launcher_env(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ARGUS_LAYOUT", "ARGUS_TRACED_PID", "SLURM_PROCID",
                "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture()
def traced(no_launcher_env):
    """Argus on in this process (a single-process job), pointed at no processor."""
    from argus.producer import api

    sock = str(short_dir("argus-h-") / "none.sock")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert api.init(socket_path=sock, flush_interval_s=3600.0, kernels="cpu_ops", op_sample_every=2)
    rt = api.runtime()
    yield RingView(rt)
    api.shutdown()

"""The diagnosis in worker threads (later windows' L3 and their screen and read beside this
window's L2, the attributions side by side) says exactly what it says in one thread, and a failure in a worker
is the diagnosis's failure, raised where that window is asked for."""

from __future__ import annotations

import importlib
import threading

import numpy as np
import pytest

from argus.analysis import DiagnoseConfig, diagnose
from argus.analysis.frames import WindowFrames, load_phases
from argus.errors import ConfigError

diagnose_mod = importlib.import_module("argus.analysis.diagnose")  # the package exports the function


def _said(d) -> dict:
    """Everything a diagnosis concludes, in a comparable form (timings aside)."""
    return {
        "incidents": [i.to_json() for i in d.incidents],
        "windows": [(w.lo, w.hi, repr(w.l2.findings), repr(w.l3.outliers if w.l3 else None)) for w in d.windows],
        "attribution": [(o.lo, o.hi, o.note, None if o.attribution is None else o.attribution.to_json(),
                         [f.culprits for f in o.findings or []]) for o in d.attribution],
        "observations": repr(d.observations),
    }


@pytest.mark.parametrize("exact_ranks", [2048, 16])  # every rank compared and replayed; screened replicas
def test_threads_say_what_one_thread_says(diagnosed, exact_ranks):
    attempt, truth, _ = diagnosed("compute_straggler")
    one = diagnose(attempt, DiagnoseConfig(store_incidents=False, exact_ranks=exact_ranks, workers=1))
    two = diagnose(attempt, DiagnoseConfig(store_incidents=False, exact_ranks=exact_ranks, workers=2))
    assert len(one.windows) > 2 and len(one.attribution) >= 1
    assert _said(two) == _said(one)
    culprits = set(truth["faults"][0]["culprit_ranks"])
    assert any(set(i.culprit_ranks) == culprits for i in two.incidents)
    assert two.timings_s["windows"] > 0


def test_a_failing_window_fails_the_diagnosis(diagnosed, monkeypatch):
    """A worker's exception is raised by the diagnosis (not lost with its thread), and no worker
    thread outlives it."""
    attempt, _, _ = diagnosed("compute_straggler")
    real = diagnose_mod.detect_kernels

    def failing(summ, layout, hosts, window, lo, *a, **kw):
        if lo >= 10:
            raise RuntimeError(f"window {lo} failed")
        return real(summ, layout, hosts, window, lo, *a, **kw)

    monkeypatch.setattr(diagnose_mod, "detect_kernels", failing)
    with pytest.raises(RuntimeError, match="window 10 failed"):
        diagnose(attempt, DiagnoseConfig(store_incidents=False, workers=2))
    assert not [t for t in threading.enumerate() if t.name.startswith("argus-")]


def test_workers_must_be_positive():
    with pytest.raises(ConfigError, match="workers"):
        DiagnoseConfig(workers=0)


def test_frames_shared_between_threads_read_like_the_store(diagnosed):
    """Requests from several threads at once (reads, views of held rows, sampled steps) give the
    rows one reader alone would, and each (window, rank) is still read once."""
    attempt, _, _ = diagnosed("pipeline_bubble")
    wf = WindowFrames(attempt, [(5, 9), (10, 14)])
    asks = [(5, 9, [1, 2, 3]), (10, 14, [4, 5]), (5, 9, [2, 3, 9]), (10, 14, [5, 6]), (6, 8, [1, 9])] * 3
    got: dict[int, object] = {}
    errors: list[BaseException] = []

    def ask(k: int) -> None:
        try:
            lo, hi, ranks = asks[k]
            got[k] = wf.phases(lo, hi, ranks=ranks)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wf.close()
    assert not errors
    for k, (lo, hi, ranks) in enumerate(asks):
        want = load_phases(attempt, lo, hi, ranks=np.array(ranks))
        f = got[k]
        assert sorted(zip(f.rank.tolist(), f.start.tolist(), f.dur.tolist())) == \
            sorted(zip(want.rank.tolist(), want.start.tolist(), want.dur.tolist()))
    # whatever order the threads ran in: each window's first request, then the ranks it lacked
    # (5–9: three ranks, then the fourth; 10–14: two, then the third) — never once per request
    assert wf.reads == 4

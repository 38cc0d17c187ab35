"""The evidence constructors the root-cause rules use write exactly the JSON objects the rules
wrote by hand before (same keys, same order, same values), and every kind they name is in the
contract."""

import json

from argus.analysis import evidence as E


class _J:
    def __init__(self, **d):
        self.d = d

    def to_json(self):
        return dict(self.d)


def _same(made, literal):
    assert json.dumps(made) == json.dumps(literal)  # order included


def test_constructors_write_the_literal_records_key_for_key():
    f = _J(kind="busy", rank=3, phase="mlp", excess_s=0.1)
    _same(E.busy_outlier(f), {"level": "L2", "kind": "busy_outlier", "rank": 3, "phase": "mlp", "excess_s": 0.1})
    _same(E.late_arrival(f), {"level": "L2", "kind": "late_arrival", "rank": 3, "phase": "mlp", "excess_s": 0.1})
    _same(E.transfer_shift(_J(collective="ar", step=4)),
          {"level": "L2", "collective": "ar", "step": 4, "kind": "transfer_shift"})
    _same(E.group_shift(_J(kernel="k", stream=7)), {"level": "L3", "kernel": "k", "stream": 7, "kind": "group_shift"})
    _same(E.w1_outlier(_J(rank=1, kernel="k")), {"level": "L3", "kind": "w1_outlier", "rank": 1, "kernel": "k"})
    _same(E.l1_window(_J(kind="regression", start_step=3)), {"level": "L1", "kind": "regression", "start_step": 3})
    _same(E.stacks(2, _J(cause="gc", samples=4)), {"level": "L5", "kind": "stacks", "rank": 2, "cause": "gc",
                                                   "samples": 4})
    _same(E.nic_port_down([1, 2]), {"level": "hw", "kind": "nic_port_down", "ranks": [1, 2]})
    _same(E.nic_port_down([1], "n"), {"level": "hw", "kind": "nic_port_down", "ranks": [1], "note": "n"})
    _same(E.kernel_time(5, 1.2, "n"), {"level": "L3", "kind": "kernel_time", "rank": 5, "ratio": 1.2, "note": "n"})
    _same(E.kernel_time(5, 1.2, "n", peer=4, window=[0, 9]),
          {"level": "L3", "kind": "kernel_time", "rank": 5, "peer": 4, "window": [0, 9], "ratio": 1.2, "note": "n"})
    _same(E.kernel_time(5, 1.2, "n", peer=4),
          {"level": "L3", "kind": "kernel_time", "rank": 5, "peer": 4, "ratio": 1.2, "note": "n"})
    _same(E.host_pressure(E.EvidenceKind.IO_PRESSURE, ["h"], {"h": 50.0}, 2.0),
          {"level": "hw", "kind": "io_pressure", "hosts": ["h"], "pressure_pct": {"h": 50.0}, "others_pct": 2.0})
    _same(E.host_pressure(E.EvidenceKind.CPU_PRESSURE, ["h"], {"h": 50.0}, 2.0, "n"),
          {"level": "hw", "kind": "cpu_pressure", "hosts": ["h"], "pressure_pct": {"h": 50.0}, "others_pct": 2.0,
           "note": "n"})
    _same(E.pcie_degraded(0, 3.0, 4.0), {"level": "hw", "kind": "pcie_degraded", "rank": 0, "pcie_gen": 3.0,
                                         "pcie_width": 4.0})
    _same(E.not_compared("n"), {"level": "L2", "kind": "not_compared", "note": "n"})
    _same(E.culprit_dismissed("inc-1", [3], "n"),
          {"level": "L4", "kind": "culprit_dismissed", "incident": "inc-1", "ranks": [3], "note": "n"})


def test_constructed_records_hold_the_contract():
    made = [E.w1_matrix("k", 7, [0, 1], [0], [[0.0, 1.0], [1.0, 0.0]]),
            E.busy_outlier(_J(kind="busy", rank=3, phase="mlp", steps=[1], ratio=1.5, excess_s=0.1)),
            E.link_errors(["h"], {"h": 3}, "n"), E.thermal_throttle(1, 91.0), E.kernels_normal(1, "n"),
            E.steps_never_finished([4]), E.blocked_in_collectives(7, {"ar": 7}), E.never_joined([1], {}),
            E.victim_transfers(["h"], [1], [2], ["ar"], "n")]
    assert E.check_evidence(made) == []

"""Root cause: combine L1–L3 findings, hardware and stack signals into incidents.

One module per rule family — ``hang``, ``compute``, ``slow_hosts``, ``stalls``, ``links`` —
over the shared ``context`` and ``impact`` helpers and the hosts' ``hardware`` signals;
``build`` runs them in order.

Rules, in the order they are applied:

* **hang** — the processors' live snapshots (``hangs.py``) when there are any, else steps
  that never finished: the culprits are the ranks that never entered the collective the
  others are blocked in.
* **compute** — a rank whose *busy* time is persistently above its peers' (L2), or whose
  compute kernels are slower than its peers' (L3, at least two kernels): the GPU or its
  work is slow. If the excess sits in one pass only (backward ≫ peers, forward ≈ peers) the
  class is ``pipeline_imbalance`` (its bubbles amplify along the pipeline), otherwise
  ``compute_straggler``. Communication that looks *shorter* on those ranks is a symptom:
  a compute culprit is never classed ``link_degradation``.
* **host stall** — a rank with huge intermittent busy excess (≥ 20% of the step) while its
  kernels are normal: the host stopped launching work. Its host phases (``gc``, ``compile``,
  ``dataloader``: ``host_phases.py``) name the cause when they explain the excess, else CPU
  stacks do.
* **link** — per-step transfer times of a minority of groups well above the rest (L2) or a
  communicator's floor shifted (L3); the hosts common to the shifted groups of different
  collectives are the culprits; a degraded PCIe link or a NIC alarm on them confirms.

State: ``confirmed`` when independent evidence agrees (L2 and L3, persistence over
windows, a hardware signal, a classified stack), else ``suspected``. Impact: extra job time
over the affected steps against L1's healthy level, or — when the fault spans the whole
run and no healthy level exists — the measured excess (busy time, transfer time).
Severity: from that impact alone (``incident.grade``; L4's what-if replaces it later), and
bounded by it whatever sets it: nothing above ``info`` below the 2% floor, never
``confirmed`` there.
"""

from argus.analysis.rootcause.build import build_incidents
from argus.analysis.rootcause.context import RootCauseConfig, WindowAnalysis, _Ctx
from argus.analysis.rootcause.impact import _measured_slowdown_pct, _spread_pct
from argus.analysis.rootcause.links import PAIR_PERSISTENCE, reinstate_victims
from argus.analysis.rootcause.slow_hosts import SLOW_HOST_EXPLAINED, _slow_hosts

__all__ = ["WindowAnalysis", "RootCauseConfig", "build_incidents", "reinstate_victims"]
# also importable from here, as before the split: the tests' handles on single rules, and the
# constants docs/diagnosis.md names as ``rootcause.X``
_ = (_Ctx, _measured_slowdown_pct, _spread_pct, _slow_hosts, PAIR_PERSISTENCE, SLOW_HOST_EXPLAINED)

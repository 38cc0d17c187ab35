"""What a health check measured, and what it concluded against a baseline and its peers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum

__all__ = ["Level", "Status", "Measurement", "Verdict", "HealthReport", "LocalGpu", "SCHEMA_VERSION", "gpu_subject"]

#: Version of the JSON document (``--json``, the saved baselines). Bumped on any change a
#: reader must know about.
SCHEMA_VERSION = 1


class Level(StrEnum):
    GPU = "gpu"  # the device's own arithmetic and memory (on a CPU-only machine: the CPU's)
    NODE = "node"  # host↔device and device↔device links (GPU only)
    NET = "net"  # collectives between ranks (gloo on CPU, NCCL on GPUs)
    E2E = "e2e"  # the bundled transformer's training throughput


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NEW = "new"  # nothing to compare with (no baseline, no peers)
    #: below the line while other processes held the node's CPUs: the node's state, not judged
    LOADED = "loaded"


def gpu_subject(uuid: str) -> str:
    """The subject of one GPU's figures: its UUID, not its index — an index changes with
    ``CUDA_VISIBLE_DEVICES`` and the enumeration order, and a replaced GPU must not be judged
    against the baseline of the one it replaced."""
    return f"gpu:{uuid}"


@dataclass(frozen=True)
class LocalGpu:
    """One GPU of this node as CUDA numbers it; ``uuid`` as NVML and the ranks' HELLO write it
    (``GPU-…``), so a health figure finds the rank that used the GPU."""

    index: int
    uuid: str
    name: str

    @property
    def subject(self) -> str:
        return gpu_subject(self.uuid)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "LocalGpu":
        return cls(int(d["index"]), str(d["uuid"]), str(d["name"]))


@dataclass(frozen=True)
class Measurement:
    level: Level
    metric: str  # e.g. "gemm_fp32_gflops", "all_reduce_busbw_gbs"
    subject: str  # what was measured: "host", "rank:3", …
    value: float  # higher is better
    unit: str
    size_bytes: int = 0  # message or buffer size, where the metric has one (0: none)
    #: the figure's own run-to-run spread measured in this run (a fraction: 1 − worst/best of its
    #: rounds; 0: not measured). A verdict never fails a deficit inside twice the noise.
    noise: float = 0.0
    #: what the hardware itself says the figure should be (a PCIe link's maximum generation and
    #: width, from NVML), where it says one: any shortfall fails, whatever its peers show — a
    #: node whose GPUs all trained down alike has no healthy peer to be compared with
    expected: float | None = None
    #: the figure of each round it was measured in (its ``value`` is their median): the
    #: distribution a verdict compares, with confidence, against the baseline's
    samples: tuple[float, ...] = ()
    #: False for a latency (µs): lower is better
    higher_is_better: bool = True
    #: round by round, this figure over what its peers measured in the same round beside it (a
    #: host's links over the links between the other hosts): where there is one, the figure is
    #: judged against its peers from these ratios — paired, so a round the whole machine ran
    #: slow in cancels out — rather than from the other subjects' values
    paired: tuple[float, ...] = ()

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (str(self.level), self.metric, self.subject, self.size_bytes)

    def to_json(self) -> dict:
        d = {**asdict(self), "level": str(self.level)}
        if self.expected is None:  # most figures have none: the document stays as it was
            del d["expected"]
        if self.samples:
            d["samples"] = [float(f"{x:.6g}") for x in self.samples]
        else:
            del d["samples"]
        if self.higher_is_better:
            del d["higher_is_better"]
        if self.paired:
            d["paired"] = [float(f"{x:.6g}") for x in self.paired]
        else:
            del d["paired"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Measurement":
        expected = d.get("expected")
        return cls(Level(d["level"]), str(d["metric"]), str(d["subject"]), float(d["value"]), str(d["unit"]),
                   int(d.get("size_bytes", 0)), float(d.get("noise", 0.0)),
                   None if expected is None else float(expected), tuple(float(x) for x in d.get("samples", ())),
                   bool(d.get("higher_is_better", True)), tuple(float(x) for x in d.get("paired", ())))


@dataclass(frozen=True)
class Verdict:
    measurement: Measurement
    status: Status
    baseline: float | None  # the node's own earlier value
    peers: float | None  # the median of the same metric on the other subjects measured now
    deficit: float  # the larger shortfall, as a fraction (0.12: 12% below)
    why: str

    def to_json(self) -> dict:
        return {**self.measurement.to_json(), "status": str(self.status), "baseline": self.baseline,
                "peers": self.peers, "deficit": round(self.deficit, 4), "why": self.why}


@dataclass
class HealthReport:
    host: str
    device: str  # "cpu" or the GPU's name
    versions: dict[str, str]
    started_s: float
    seconds: float = 0.0
    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (level or check, reason)
    #: the host of each rank, for a net check launched across ranks (``rank:N`` subjects → nodes)
    rank_hosts: list[str] = field(default_factory=list)
    #: the node's GPUs as measured (CUDA index → UUID), the key of every per-GPU figure
    gpus: list[LocalGpu] = field(default_factory=list)
    #: launched across ranks: the second measurement where the first failed (not in the document:
    #: the figures it replaced are, ``remeasured``)
    again: "HealthReport | None" = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "host": self.host, "device": self.device,
                "versions": self.versions, "started_s": self.started_s, "seconds": round(self.seconds, 3),
                "measurements": [m.to_json() for m in self.measurements],
                "skipped": [{"check": c, "reason": r} for c, r in self.skipped],
                **({"rank_hosts": self.rank_hosts} if self.rank_hosts else {}),
                **({"gpus": [g.to_json() for g in self.gpus]} if self.gpus else {})}

    def with_runs(self, others: list["HealthReport"]) -> "HealthReport":
        """This run and ``others`` of the same checks as one baseline: each figure's rounds (and
        round-by-round ratios to its peers) pooled, its value their median, its ``noise`` the spread of the runs' own values (1 −
        lowest/highest) — on a shared machine runs differ more than one run's rounds do (a
        process lands on a faster or slower vCPU), and a verdict must not fail inside that."""
        from dataclasses import replace
        from statistics import median

        runs = [{m.key: m for m in r.measurements} for r in others]
        for i, m in enumerate(self.measurements):
            same = [r[m.key] for r in runs if m.key in r]
            if not same:
                continue
            rounds = tuple(x for k in (m, *same) for x in (k.samples or (k.value,)))
            values = [k.value for k in (m, *same)]
            spread = 1.0 - min(values) / max(values) if max(values) > 0 else 0.0
            # its round-by-round ratios against its peers pooled too: the baseline judged on every
            # run's rounds, not on its first run's alone (a healthy host failed CI's baseline check,
            # one run's ten rounds 18% below its peers and no second measurement to outvote them)
            paired = tuple(x for k in (m, *same) for x in k.paired)
            self.measurements[i] = replace(m, value=float(median(rounds)), samples=rounds, noise=spread,
                                           paired=paired)
        self.seconds += sum(r.seconds for r in others)
        return self

    def remeasured(self, again: "HealthReport", keys: set) -> list[tuple]:
        """Each figure of ``keys`` as ``again`` measured it (the figure judged now). Returns the
        keys replaced."""
        more = {m.key: m for m in again.measurements if m.key in keys}
        for i, m in enumerate(self.measurements):
            if m.key in more:
                self.measurements[i] = more[m.key]
        return [k for k in (m.key for m in self.measurements) if k in more]

    @classmethod
    def from_json(cls, d: dict) -> "HealthReport":
        if int(d.get("schema_version", 0)) != SCHEMA_VERSION:
            raise ValueError(f"schema_version {d.get('schema_version')!r}, expected {SCHEMA_VERSION}")
        return cls(str(d["host"]), str(d["device"]), {str(k): str(v) for k, v in d["versions"].items()},
                   float(d["started_s"]), float(d.get("seconds", 0.0)),
                   [Measurement.from_json(m) for m in d["measurements"]],
                   [(str(s["check"]), str(s["reason"])) for s in d.get("skipped", [])],
                   [str(h) for h in d.get("rank_hosts", [])], [LocalGpu.from_json(g) for g in d.get("gpus", [])])

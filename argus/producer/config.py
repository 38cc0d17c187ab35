"""Producer configuration: explicit argument > ``ARGUS_*`` environment variable > default.

Every environment variable is listed next to the field it sets. Unknown keyword arguments
are an error (with the key's name): a misspelt option must not be silently ignored. A bad
value makes :func:`resolve_config` raise; ``argus.init`` turns that into one warning and a
disabled producer, so training is never stopped by Argus.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

from argus import env as argus_env
from argus.errors import ConfigError

__all__ = ["ProducerConfig", "Identity", "resolve_config", "resolve_identity", "ENV"]

#: field → environment variable (what each does: argus/env.py)
ENV = {
    "enabled": argus_env.ENABLE,
    "socket_path": argus_env.SOCKET,
    "layout": argus_env.LAYOUT,
    "order": argus_env.ORDER,
    "run_id": argus_env.RUN_ID,
    "run_id_proposal": argus_env.RUN_ID_PROPOSAL,
    "attempt_id": argus_env.ATTEMPT_ID,
    "host": argus_env.HOST,
    "flush_interval_s": argus_env.FLUSH_S,
    "buffer_events": argus_env.BUFFER_EVENTS,
    "kernels": argus_env.KERNELS,
    "op_sample_every": argus_env.OP_SAMPLE_EVERY,
    "module_patterns": argus_env.MODULE_PATTERNS,
    "stacks_hz": argus_env.STACKS_HZ,
    "sdc_every": argus_env.SDC_EVERY,
    "sdc_gemms": argus_env.SDC_GEMMS,
}

#: Module-level phases: phase name → words matched in the module's class name (lowercase).
DEFAULT_MODULE_PATTERNS: dict[str, tuple[str, ...]] = {
    "moe_layer": ("moe", "mixtureofexperts", "sparsemlp"),
    "moe_experts": ("experts", "groupedmlp", "grouped_mlp"),
    "self_attention": ("attention", "attn"),
    "mlp": ("mlp", "feedforward", "ffn"),
}


@dataclass(kw_only=True, slots=True)
class ProducerConfig:
    enabled: bool = True
    socket_path: str = ""
    layout: str = ""
    order: str = ""
    run_id: str = ""
    run_id_proposal: str = ""
    attempt_id: str = ""
    host: str = ""
    flush_interval_s: float = 1.0
    buffer_events: int = 200_000
    kernels: str = "auto"
    op_sample_every: int = 50  # a captured CPU step costs ~+70%: 1 in 50 ≈ 1.4% (argus bench overhead)
    module_patterns: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_MODULE_PATTERNS))
    stacks_hz: float = 0.0
    #: the correctness sensors' period: a checked step costs ~5% of the bench model's step
    #: (``argus bench sdc``), 0.27% at 20; a parameter once corrupted stays so, so the period
    #: bounds how late it is seen, not whether
    sdc_every: int = 20
    sdc_gemms: int = 1  # one layer a due step, in turn: ~3 passes over its input and weight

    def __post_init__(self) -> None:
        if self.flush_interval_s <= 0:
            raise ConfigError(f"flush_interval_s must be > 0, got {self.flush_interval_s}")
        if self.buffer_events < 1000:
            raise ConfigError(f"buffer_events must be at least 1000, got {self.buffer_events}")
        if self.kernels not in ("auto", "cupti", "cpu_ops", "off"):
            raise ConfigError(f"kernels={self.kernels!r}: choose auto, cupti, cpu_ops or off")
        if self.op_sample_every < 1:
            raise ConfigError(f"op_sample_every must be >= 1, got {self.op_sample_every}")
        if self.sdc_gemms < -1:
            raise ConfigError(f"sdc_gemms must be -1 (all), 0 (none) or a count, got {self.sdc_gemms}")
        if self.sdc_every < 0:
            raise ConfigError(f"sdc_every must be >= 0, got {self.sdc_every}")
        if self.stacks_hz < 0:
            raise ConfigError(f"stacks_hz must be >= 0, got {self.stacks_hz}")


def _parse_patterns(text: str) -> dict[str, tuple[str, ...]]:
    out = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        name, sep, words = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{argus_env.MODULE_PATTERNS} item {item!r} is not phase=word|word")
        out[name.strip()] = tuple(w.strip().lower() for w in words.split("|") if w.strip())
    return out


def _coerce(name: str, raw: str) -> Any:
    kind = {f.name: f.type for f in fields(ProducerConfig)}[name]
    try:
        if kind == "bool":
            return raw.strip().lower() not in ("0", "false", "no", "off", "")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise ConfigError(f"{ENV[name]}={raw!r} is not a valid {kind}") from None
    if name == "module_patterns":
        return _parse_patterns(raw)
    return raw


def resolve_config(explicit: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> ProducerConfig:
    environ = os.environ if environ is None else environ
    explicit = dict(explicit or {})
    known = {f.name for f in fields(ProducerConfig)}
    unknown = sorted(set(explicit) - known)
    if unknown:
        raise ConfigError(f"unknown argus.init option {unknown[0]!r}; options are {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for name, var in ENV.items():
        if name in explicit:
            values[name] = explicit[name]
        elif var in environ:
            values[name] = _coerce(name, environ[var])
    return ProducerConfig(**values)


@dataclass(frozen=True, slots=True)
class Identity:
    rank: int
    world_size: int
    local_rank: int
    host: str
    run_id: str
    attempt_id: str
    pid: int


def resolve_identity(config: ProducerConfig, environ: Mapping[str, str] | None = None, rank: int | None = None,
                     world_size: int | None = None, agree: Callable[[str], str] | None = None) -> Identity:
    """Rank and world from the process group when given (``rank``, ``world_size``), else from
    the usual launcher variables (torchrun, Slurm, MPI); host, run and attempt from the
    options and the launcher.

    The run id is one for the whole job, however its hosts were started: an id given to every
    rank (``ARGUS_RUN_ID``, ``--run-id``; Slurm's job id) as is; otherwise ``agree(proposal)``
    returns the id the job's ranks agreed on (the first proposal to reach the job's own
    rendezvous store, ``agree_run_id``). Each host's ``argus run`` proposes a name from its
    own start time; hosts started a second apart would otherwise split one job into two runs."""
    env = os.environ if environ is None else environ

    def first(*names: str, default: str) -> str:
        for n in names:
            if env.get(n, "") != "":
                return env[n]
        return default

    try:
        if rank is None:
            rank = int(first("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", default="0"))
        world = world_size if world_size is not None else int(
            first("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default="1"))
        local = int(first("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                          default=str(rank)))
    except ValueError as exc:
        raise ConfigError(f"cannot read the rank from the environment: {exc}") from None
    if not 0 <= rank < world:
        raise ConfigError(f"rank {rank} is outside a world of {world}")
    host = config.host or first(argus_env.HOST, "SLURMD_NODENAME", default=socket.gethostname()) or "localhost"
    run_id = config.run_id or first("SLURM_JOB_ID", default="") or ""
    if not run_id:
        elastic = first("TORCHELASTIC_RUN_ID", default="") or ""
        proposal = config.run_id_proposal or (elastic if elastic.lower() != "none" else "") or "run"
        run_id = agree(proposal) if agree is not None else proposal
    attempt = config.attempt_id or first("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT", default="0") or "0"
    return Identity(rank, world, local, host.replace("/", "_"), run_id.replace("/", "_"),
                    attempt.replace("/", "_"), os.getpid())


def default_socket(config: ProducerConfig) -> str:
    from argus.wire.paths import default_socket_path

    return config.socket_path or str(default_socket_path())

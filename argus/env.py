"""Every ``ARGUS_*`` environment variable, each named once: what it does and who reads it.

Code reads ``os.environ.get(env.HOST)``, never the spelled-out name, so a variable is
renamed (or found) in one place; ``tests/test_env.py`` fails on any ``"ARGUS_…"`` string
literal elsewhere in ``argus/``. One exception: the ``sitecustomize`` that ``argus run``
injects into every Python process spells out ``ARGUS_ENABLE``, since a disabled job must not
import anything of Argus. This module imports nothing: the producer reads it inside
training, and ``import argus.env`` must stay free.

Precedence wherever a variable backs a config field: explicit argument > variable > default.
"""

from __future__ import annotations

__all__ = ["ENABLE", "FORCE", "SOCKET", "RING_DIR", "LAYOUT", "ORDER", "RUN_ID", "RUN_ID_PROPOSAL", "ATTEMPT_ID",
           "HOST", "FLUSH_S", "BUFFER_EVENTS", "KERNELS", "OP_SAMPLE_EVERY", "MODULE_PATTERNS", "STACKS_HZ",
           "SDC_EVERY", "SDC_GEMMS", "TRACED_PID", "PY_SPY", "HANG_MIN_S", "HANG_STEP_FACTOR", "EVIDENCE_MAX_BYTES",
           "EVIDENCE_MAX_AGE_S", "TSDB_JOB", "SERVE_TOKEN", "CACHE_DIR", "HEALTHCHECK_DIR"]

# --- the producer, inside training (argus/producer; set by `argus run` for its job) -------------
#: 0/false/no/off disables everything (one boolean check per hook); producer config, sitecustomize.
ENABLE = "ARGUS_ENABLE"
#: "1": trace a job that never makes a process group (producer/api.py, ``arm``).
FORCE = "ARGUS_FORCE"
#: The processor's unix socket (default /tmp/argus-$UID/processor.sock): producer, wire/paths.py.
SOCKET = "ARGUS_SOCKET"
#: Directory of the ranks' shared-memory rings (default /dev/shm): wire/paths.py.
RING_DIR = "ARGUS_RING_DIR"
#: Parallel layout, e.g. "pp=2,dp=2" (default pure data parallel): producer config.
LAYOUT = "ARGUS_LAYOUT"
#: Rank order, fastest axis first (default tp-cp-ep-dp-pp): producer config.
ORDER = "ARGUS_ORDER"
#: A run id every rank is given (default SLURM_JOB_ID, else agreed): producer config, ``argus run``.
RUN_ID = "ARGUS_RUN_ID"
#: What this rank proposes when the ranks agree on a run id (set by ``argus run``): producer config.
RUN_ID_PROPOSAL = "ARGUS_RUN_ID_PROPOSAL"
#: Attempt id (default TORCHELASTIC_RESTART_COUNT, else "0"): producer config.
ATTEMPT_ID = "ARGUS_ATTEMPT_ID"
#: Host name for the store partition (default the host name): producer, ``argus run``, healthcheck.
HOST = "ARGUS_HOST"
#: The producer's transport tick in seconds: (re)connect, read controls. Producer config.
FLUSH_S = "ARGUS_FLUSH_S"
#: Ring capacity per table (capped, producer/runtime.py); full: drop and count. Producer config.
BUFFER_EVENTS = "ARGUS_BUFFER_EVENTS"
#: Kernel channel: auto | cupti | cpu_ops | off. Producer config, ``argus run --kernels``.
KERNELS = "ARGUS_KERNELS"
#: CPU op source: capture one step in N. Producer config (demo and bench set it for their jobs).
OP_SAMPLE_EVERY = "ARGUS_OP_SAMPLE_EVERY"
#: Module-level phases, "phase=word|word;phase=word": producer config.
MODULE_PATTERNS = "ARGUS_MODULE_PATTERNS"
#: In-process stack sampling rate (0: only when the processor asks): producer config.
STACKS_HZ = "ARGUS_STACKS_HZ"
#: Digest replicas' gradients and parameters every N optimizer steps (0: off): producer config.
SDC_EVERY = "ARGUS_SDC_EVERY"
#: Linear layers whose forward GEMM is checked on those steps (0: none, -1: all): producer config.
SDC_GEMMS = "ARGUS_SDC_GEMMS"
#: Set in a traced rank; its descendants are not ranks of their own (producer/activation.py).
TRACED_PID = "ARGUS_TRACED_PID"

# --- the processor (argus/processor, `argus processor`) -----------------------------------------
#: Path of the py-spy executable (default: next to this Python, else on PATH): processor/stacks.py.
PY_SPY = "ARGUS_PY_SPY"
#: Live hang detection: never a hang before this many seconds without progress (``argus processor``).
HANG_MIN_S = "ARGUS_HANG_MIN_S"
#: … nor before this many median step times (``argus processor``).
HANG_STEP_FACTOR = "ARGUS_HANG_STEP_FACTOR"
#: Evidence retention by size, bytes per host ("none": no size limit): evidence/retention.py.
EVIDENCE_MAX_BYTES = "ARGUS_EVIDENCE_MAX_BYTES"
#: Evidence retention by age, seconds ("none": no age limit): evidence/retention.py.
EVIDENCE_MAX_AGE_S = "ARGUS_EVIDENCE_MAX_AGE_S"
#: ``job`` label of the series sent to a Prometheus remote-write endpoint (default "argus"): tsdb/sink.py.
TSDB_JOB = "ARGUS_TSDB_JOB"

# --- the other services and commands -------------------------------------------------------------
#: Access token of ``argus serve`` when not given as --token (keeps it out of `ps`): serve/config.py.
SERVE_TOKEN = "ARGUS_SERVE_TOKEN"
#: Local cache of object-store copies (default ~/.cache/argus/objstore): objstore/sync.py.
CACHE_DIR = "ARGUS_CACHE_DIR"
#: Where health-check baselines live, one file per host (default ~/.argus/healthcheck): healthcheck.
HEALTHCHECK_DIR = "ARGUS_HEALTHCHECK_DIR"

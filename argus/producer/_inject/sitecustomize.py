"""Injected by ``argus run`` (on PYTHONPATH): start the producer in every rank, zero code.

Activates in processes that are ranks (``RANK`` set by torchrun/launchers) or when
``ARGUS_FORCE=1`` (a single-process command); never in the launcher itself. Then chains
to any ``sitecustomize`` that was on the path before.
"""

import os
import sys


def _argus_start() -> None:
    if os.environ.get("ARGUS_ENABLE", "1").lower() in ("0", "false", "no", "off"):
        return
    if "RANK" not in os.environ and os.environ.get("ARGUS_FORCE") != "1":
        return
    try:
        import argus

        argus.init()
    except Exception as exc:  # noqa: BLE001 - never break the user's program
        print(f"argus: not started: {exc}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            with open(candidate, "rb") as fh:
                code = compile(fh.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


_chain()
_argus_start()

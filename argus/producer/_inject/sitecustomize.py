"""Injected by ``argus run`` (on PYTHONPATH) into every Python process of the job: arm the
producer, which starts only in processes that become ranks (``argus/producer/activation.py``)
— never in the launcher, its helpers or the ranks' workers. Then chains to any
``sitecustomize`` that was on the path before.
"""

import os
import sys


def _argus_arm() -> None:
    if os.environ.get("ARGUS_ENABLE", "1").lower() in ("0", "false", "no", "off"):
        return
    try:
        from argus.producer.api import arm

        arm()
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
_argus_arm()

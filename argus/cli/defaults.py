"""Flag defaults read from the config dataclasses, so a command never restates a number.

A flag that sets a config field takes its default from the field: change the default in the
dataclass and ``--help`` and the command follow (torchtitan builds its CLI from its configs the
same way). Help texts format the value in (``f"(default {value:g})"``) so they stay true.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["config_default"]


def config_default(config: type, name: str) -> Any:
    """The default of field ``name`` of dataclass ``config`` (``default_factory`` called).

    Raises ``KeyError`` for an unknown field and ``TypeError`` for one without a default: a
    renamed field breaks ``argus --help`` in the tests, not a user's flag silently."""
    found = {f.name: f for f in dataclasses.fields(config)}
    if name not in found:
        raise KeyError(f"{config.__name__} has no field {name!r}")
    field = found[name]
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise TypeError(f"{config.__name__}.{name} has no default")

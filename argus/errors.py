"""One exception hierarchy for the CLI and services (the in-process producer never raises)."""

from __future__ import annotations

__all__ = ["ArgusError", "LayoutError", "StoreError", "ScenarioError", "ConfigError", "IngestError", "ProtocolError",
           "TsdbError"]


class ArgusError(Exception):
    """Base of every error Argus raises on purpose; the CLI prints it without a traceback."""


class LayoutError(ArgusError, ValueError):
    """A parallel layout or rank order that cannot describe the job."""


class StoreError(ArgusError):
    """A store directory or file that cannot be read or written as asked."""


class ScenarioError(ArgusError, ValueError):
    """An unknown simulator scenario or bad scenario parameters."""


class ConfigError(ArgusError, ValueError):
    """A configuration value that is out of range or of the wrong kind."""


class IngestError(ArgusError):
    """An input trace that cannot be imported (names the file and the problem)."""


class ProtocolError(ArgusError):
    """A malformed or unsupported frame on the producer → processor socket."""


class TsdbError(StoreError):
    """A ``prom://`` URL that cannot be used, or a TSDB that cannot be reached or refuses a query."""

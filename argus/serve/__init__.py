"""The web UI: a read-only, live view of a store over HTTP (stdlib server, no dependencies),
reusing the report's plots. Binds 127.0.0.1 unless given a token or ``--insecure``."""

from argus.serve.config import DEFAULT_PORT, ENV_TOKEN, ServeConfig, is_loopback
from argus.serve.server import ArgusServer, make_server, safe_evidence_path, serve

__all__ = ["ArgusServer", "DEFAULT_PORT", "ENV_TOKEN", "ServeConfig", "is_loopback", "make_server",
           "safe_evidence_path", "serve"]

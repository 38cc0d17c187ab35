"""The processor's unix socket: bound privately, published atomically, stale ones replaced."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from pathlib import Path

from argus.errors import ArgusError, ConfigError
from argus.wire import check_private_dir, runtime_dir

__all__ = ["listen"]


def listen(path: Path) -> socket.socket:
    """A non-blocking listening socket at ``path``, bound and listening before the path
    appears (whoever sees it can connect); refuses when another processor listens there."""
    _private_parent(path)
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            probe.close()
            raise ArgusError(f"{path}: another processor is already listening there")
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink()  # stale socket of a dead processor
        finally:
            probe.close()
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        lst.bind(str(tmp))
        os.chmod(tmp, 0o600)
        lst.listen(256)
        os.replace(tmp, path)
    except OSError:  # e.g. the temporary name is past the 108-byte limit: bind in place
        tmp.unlink(missing_ok=True)
        lst.close()
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lst.bind(str(path))
        os.chmod(path, 0o600)
        lst.listen(256)
    lst.setblocking(False)
    return lst


def _private_parent(path: Path) -> None:
    """Create the socket's directory private (0700). The default runtime directory is checked
    for owner and mode (``check_private_dir``); any other existing directory must not let other
    users replace the socket (not writable by them, or sticky like /tmp)."""
    parent = path.parent
    if parent == Path(tempfile.gettempdir()) / f"argus-{os.getuid()}":
        runtime_dir()  # created private, and checked for owner and mode
        return
    if not parent.exists():
        parent.mkdir(parents=True, mode=0o700)
        check_private_dir(parent)
        return
    st = os.stat(parent)
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        raise ConfigError(f"{parent} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}) without the "
                          "sticky bit: another user could replace the socket; choose a private directory")

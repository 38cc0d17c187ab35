"""Where the two ends of the wire meet: the processor's socket and the ranks' rings.

One default, one place. The socket is ``$ARGUS_SOCKET``, else ``processor.sock`` in the
per-user runtime directory ``/tmp/argus-$UID``. That directory is created ``0700`` and checked
on every use: owned by this user, not a symlink, no access for group or others. Another
local user who pre-creates it (to swap the socket and read the ranks' HELLO) makes
:func:`runtime_dir` raise instead of being trusted.

Rings (``ring.py``) live in ``$ARGUS_RING_DIR``, else ``/dev/shm`` (memory, never written
back to a disk), else the runtime directory.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from argus import env as argus_env
from argus.errors import ConfigError

__all__ = ["SOCKET_ENV", "RING_DIR_ENV", "runtime_dir", "default_socket_path", "ring_dir", "check_private_dir"]

SOCKET_ENV = argus_env.SOCKET  # the processor's unix socket (argus run sets it for its job)
RING_DIR_ENV = argus_env.RING_DIR  # directory of the ranks' shared-memory rings


def check_private_dir(path: Path) -> Path:
    """``path`` if it is a real directory of this user that nobody else can write (one only
    readable by others is closed to ``0700``); else :class:`ConfigError` naming what is wrong."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} is not a directory (a symlink or a file is never trusted)")
    if st.st_uid != os.getuid():
        raise ConfigError(f"{path} belongs to uid {st.st_uid}, not to this user ({os.getuid()}): "
                          "another user may have created it; remove it or set ARGUS_SOCKET elsewhere")
    if st.st_mode & 0o022:  # others could have put a socket or a link in it: never trusted
        raise ConfigError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                          "remove it (Argus recreates it private)")
    if st.st_mode & 0o077:  # ours, only readable by others: close it
        os.chmod(path, 0o700)
    return path


def runtime_dir() -> Path:
    """``/tmp/argus-$UID`` (under the system temp directory), created private if missing."""
    path = Path(tempfile.gettempdir()) / f"argus-{os.getuid()}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    return check_private_dir(path)


def default_socket_path() -> Path:
    env = os.environ.get(SOCKET_ENV)
    return Path(env) if env else runtime_dir() / "processor.sock"


def ring_dir() -> Path:
    env = os.environ.get(RING_DIR_ENV)
    if env:
        return Path(env)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return runtime_dir()

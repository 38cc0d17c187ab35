"""A rank's shared-memory ring: what the training process records survives its death.

The producer writes every record straight into a file mapped into memory (``/dev/shm`` by
default, ``paths.ring_dir``); the host's processor maps the same file and drains it. A record
is in the ring as soon as the call that made it returns — no buffer in the process, no
flush, no syscall — so ``os._exit``, SIGKILL or a segfault loses nothing already recorded,
and the processor reads a stuck rank's state (``inflight.py``) even while that rank holds
the GIL. The processor learns the file's path from the rank's ``HELLO``.

Layout (little-endian; offsets in bytes; every area starts on a 64-byte boundary)::

    header, 4096 bytes at 0
      0  8  magic b"ARGSRING"          40  4  n_tables u32
      8  4  version u32 (1)            44  4  state u32: 0 open, 1 closed by its writer
     12  4  header_bytes u32 (4096)    48  8  names_offset u64
     16  8  file_bytes u64             56  8  names_bytes u64 (size of the names area)
     24  8  writer pid i64             64  8  inflight_offset u64 (inflight.BLOCK_BYTES)
     32  8  created_ns i64             72  8  reserved
     80  n_tables × 32: table directory
          0 u16 msg (wire message type)   2 u16 record_bytes   4 u32 capacity (records)
          8 u64 data_offset              16 u64 counters_offset  24 u64 reserved
    counters, 64 bytes per table: head u64 (records written), tail u64 (records consumed,
      written only by the reader), dropped u64 (records refused because the ring was full)
    names area: published_bytes u64, published_count u64, dropped u64, 40 bytes reserved,
      then entries ``u32 length, UTF-8 bytes``; a name's id is its index. Id 0 is
      ``(name table full)``, used once the area is full.
    in-flight block (``inflight.py``)
    data areas: ``capacity × record_bytes`` each, records in the wire dtypes
      (``protocol.DTYPES``), record ``i`` at ``data_offset + (i % capacity) × record_bytes``

One writer process: its threads share a lock that no write ever waits for (see
:class:`RingWriter`): the training thread, and callback threads that report completions. Records are written, then ``head`` is published; the reader
copies ``[tail, head)`` and then publishes ``tail``. On x86 stores become visible in program
order; on weakly ordered CPUs a reader could see ``head`` before the record's bytes, so a
live ring is read only up to the head seen on the reader's *previous* pass
(:meth:`RingReader.drain` with ``settled=True``), and fully once the writer is gone.

The file's space is reserved at creation (``posix_fallocate``): a full ``tmpfs`` then fails
the creation, instead of killing the training process with SIGBUS on a later write.
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from argus.errors import ProtocolError
from argus.wire.inflight import BLOCK_BYTES, InflightReader, InflightWriter
from argus.wire.protocol import DTYPES, Msg

__all__ = ["MAGIC", "VERSION", "RING_TABLES", "RingWriter", "RingReader", "ring_bytes", "OVERFLOW_NAME"]

MAGIC = b"ARGSRING"
VERSION = 1
HEADER_BYTES = 4096
_HEAD = struct.Struct("<8sIIQqqIIQQQQ")  # up to inflight_offset + reserved: 80 bytes
_DIR = struct.Struct("<HHIQQQ")
_U64 = struct.Struct("<Q")
_U64X2 = struct.Struct("<QQ")
_U32 = struct.Struct("<I")
NAMES_HEADER = 64
OVERFLOW_NAME = "(name table full)"
STATE_CLOSED = 1

#: What a producer's ring carries, in directory order, and default capacities (records).
RING_TABLES: dict[Msg, int] = {Msg.STEPS: 8192, Msg.PHASES: 65536, Msg.KERNELS: 131072, Msg.STACKS: 16384,
                               Msg.CHECKS: 1024}
DEFAULT_NAMES_BYTES = 1 << 20
#: Largest ring file a reader maps. The default ring is ~10 MiB (``ring_bytes()``); a file
#: that claims more is refused, so a garbage or hostile header cannot make one drain copy
#: gigabytes into the processor.
MAX_RING_BYTES = 256 << 20
#: Names one :meth:`RingReader.new_names` call returns at most: a header that claims millions
#: of zero-length names is read a bounded slice per drain pass, not in one loop.
MAX_NAMES_PER_PASS = 65536


def _align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


def _struct_of(dtype: np.dtype) -> struct.Struct:
    """The ``struct`` format packing one record of a packed little-endian numpy dtype."""
    codes = {"i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q", "u8": "Q", "f8": "d"}
    fields, names = dtype.fields, dtype.names
    assert fields is not None and names is not None, dtype
    fmt = "<" + "".join(codes[fields[n][0].str[1:]] for n in names)
    s = struct.Struct(fmt)
    assert s.size == dtype.itemsize, (fmt, dtype)
    return s


@dataclass(frozen=True)
class _Layout:
    tables: tuple[tuple[Msg, int, int, int, int], ...]  # (msg, record_bytes, capacity, data_off, counters_off)
    names_offset: int
    names_bytes: int
    inflight_offset: int
    file_bytes: int


def _layout(capacities: Mapping[Msg, int], names_bytes: int) -> _Layout:
    off = HEADER_BYTES
    counters = []
    for _ in capacities:
        counters.append(off)
        off += 64
    names_offset = _align(off)
    off = names_offset + _align(names_bytes)
    inflight_offset = off
    off = _align(off + BLOCK_BYTES, 4096)
    tables = []
    for (msg, cap), ctr in zip(capacities.items(), counters):
        size = DTYPES[msg].itemsize
        tables.append((msg, size, int(cap), off, ctr))
        off = _align(off + size * int(cap), 4096)
    return _Layout(tuple(tables), names_offset, _align(names_bytes), inflight_offset, off)


def ring_bytes(capacities: Mapping[Msg, int] = RING_TABLES, names_bytes: int = DEFAULT_NAMES_BYTES) -> int:
    return _layout(capacities, names_bytes).file_bytes


class _Table:
    __slots__ = ("msg", "pack", "size", "cap", "data", "ctr", "head", "tail", "dropped", "dtype")

    def __init__(self, msg: Msg, size: int, cap: int, data: int, ctr: int):
        self.msg, self.size, self.cap, self.data, self.ctr = msg, size, cap, data, ctr
        self.dtype = DTYPES[msg]
        self.pack = _struct_of(self.dtype).pack_into
        self.head = self.tail = self.dropped = 0


class RingWriter:
    """The producer's end. A write costs two ``pack_into`` under a lock and no syscall, and
    never blocks: a thread that finds the lock taken (another thread writing, or this thread
    re-entered from a garbage-collector callback in the middle of a write) leaves its write
    to the lock's holder, which performs it before releasing (or to the next write, or to
    :meth:`settle`)."""

    def __init__(self, path: Path, fd: int, mm: mmap.mmap, layout: _Layout):
        self.path = path
        self._fd = fd
        self._mm = mm
        self._layout = layout
        self._lock = threading.Lock()
        self._deferred: deque = deque()
        self._names_lock = threading.Lock()
        self._tables = {msg: _Table(msg, size, cap, data, ctr) for msg, size, cap, data, ctr in layout.tables}
        self._names: dict[str, int] = {}
        self._names_used = 0
        self._names_dropped = 0
        self.pid = os.getpid()
        self.inflight = InflightWriter(mm, layout.inflight_offset, self.run)
        self.closed = False
        self.name_id(OVERFLOW_NAME)

    @classmethod
    def create(cls, directory: Path | str, capacities: Mapping[Msg, int] = RING_TABLES,
               names_bytes: int = DEFAULT_NAMES_BYTES, tag: str = "") -> "RingWriter":
        """A new ring file in ``directory`` (private to this user); ``OSError`` if the space
        cannot be reserved."""
        layout = _layout(capacities, names_bytes)
        name = f"argus-{os.getuid()}-{os.getpid()}-{tag + '-' if tag else ''}{secrets.token_hex(4)}.ring"
        path = Path(directory) / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, layout.file_bytes)
            mm = mmap.mmap(fd, layout.file_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        _HEAD.pack_into(mm, 0, MAGIC, VERSION, HEADER_BYTES, layout.file_bytes, os.getpid(), time.time_ns(),
                        len(layout.tables), 0, layout.names_offset, layout.names_bytes, layout.inflight_offset, 0)
        for i, (msg, size, cap, data, ctr) in enumerate(layout.tables):
            _DIR.pack_into(mm, _HEAD.size + i * _DIR.size, int(msg), size, cap, data, ctr, 0)
        return cls(path, fd, mm, layout)

    # -- the lock ----------------------------------------------------------------------------
    def run(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` under the ring's lock, now or (lock taken) before it is released."""
        if self.closed:
            return
        if not self._lock.acquire(blocking=False):
            self._deferred.append((fn, args))
            return
        try:
            fn(*args)
            while self._deferred:
                f, a = self._deferred.popleft()
                f(*a)
        finally:
            self._lock.release()

    def settle(self) -> None:
        """Perform writes left behind by threads that found the lock taken."""
        if self._deferred:
            self.run(_nothing)

    # -- records ---------------------------------------------------------------------------
    def append(self, msg: Msg, *fields: int | float) -> None:
        """Write one record (the fields of ``DTYPES[msg]`` in order); a full ring counts it as
        dropped."""
        self.run(self._append, self._tables[msg], fields)

    def _append(self, t: _Table, fields: tuple) -> None:
        mm = self._mm
        head = t.head
        if head - t.tail >= t.cap:
            t.tail = _U64.unpack_from(mm, t.ctr + 8)[0]
            if head - t.tail >= t.cap:
                t.dropped += 1
                _U64.pack_into(mm, t.ctr + 16, t.dropped)
                return
        t.pack(mm, t.data + (head % t.cap) * t.size, *fields)
        t.head = head + 1
        _U64.pack_into(mm, t.ctr, head + 1)

    def extend(self, msg: Msg, records: np.ndarray) -> None:
        """Write a batch of records of ``DTYPES[msg]`` (vectorised); what does not fit is
        counted as dropped."""
        t = self._tables[msg]
        if len(records):
            self.run(self._extend, t, records if records.dtype == t.dtype else records.astype(t.dtype))

    def _extend(self, t: _Table, records: np.ndarray) -> None:
        mm, n = self._mm, len(records)
        head = t.head
        room = t.cap - (head - t.tail)
        if room < n:
            t.tail = _U64.unpack_from(mm, t.ctr + 8)[0]
            room = t.cap - (head - t.tail)
        take = max(min(room, n), 0)
        if take < n:
            t.dropped += n - take
            _U64.pack_into(mm, t.ctr + 16, t.dropped)
        view = np.frombuffer(mm, t.dtype, count=t.cap, offset=t.data)
        pos = head % t.cap
        first = min(take, t.cap - pos)
        view[pos:pos + first] = records[:first]
        if take > first:
            view[:take - first] = records[first:take]
        del view
        t.head = head + take
        _U64.pack_into(mm, t.ctr, head + take)

    def dropped(self, msg: Msg) -> int:
        return self._tables[msg].dropped

    # -- names -----------------------------------------------------------------------------
    def name_id(self, name: str) -> int:
        """The id of ``name`` (published to the reader the first time). Blocks briefly on its
        own lock: never call it from a garbage-collector callback (intern names beforehand)."""
        found = self._names.get(name)
        if found is not None:
            return found
        data = name.encode("utf-8", "replace")[:4096]
        with self._names_lock:
            found = self._names.get(name)
            if found is not None:
                return found
            if self.closed:
                return 0
            lay, mm = self._layout, self._mm
            need = _U32.size + len(data)
            if NAMES_HEADER + self._names_used + need > lay.names_bytes:
                self._names_dropped += 1
                _U64.pack_into(mm, lay.names_offset + 16, self._names_dropped)
                return 0
            at = lay.names_offset + NAMES_HEADER + self._names_used
            _U32.pack_into(mm, at, len(data))
            mm[at + _U32.size:at + need] = data
            self._names_used += need
            found = len(self._names)
            self._names[name] = found
            _U64X2.pack_into(mm, lay.names_offset, self._names_used, found + 1)
        return found

    # -- lifecycle -------------------------------------------------------------------------
    def close(self, unlink: bool = False) -> None:
        """Mark the ring closed (the reader then knows nothing more will come); ``unlink``
        removes the file: only when no processor will read it. The mapping stays (a thread
        may still hold a view); the process's exit releases it."""
        if self.closed:
            return
        self.settle()
        self.closed = True
        try:
            _U32.pack_into(self._mm, 44, STATE_CLOSED)
        except (ValueError, OSError):
            pass
        if unlink:
            self.path.unlink(missing_ok=True)

    def forget_in_child(self) -> None:
        """After ``fork``: this process is not the writer (its locks may be held by threads
        that do not exist here): never write, never unlink."""
        self.closed = True
        self._lock = threading.Lock()
        self._names_lock = threading.Lock()
        self._deferred = deque()


def _nothing() -> None:
    pass


class RingReader:
    """The processor's end: validates the file, then drains its tables and names."""

    def __init__(self, path: Path | str, expect_pid: int | None = None):
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO never blocks
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ProtocolError(f"{self.path} is not a regular file")
            if st.st_uid not in (os.getuid(), 0):
                raise ProtocolError(f"{self.path} belongs to uid {st.st_uid}: not reading another user's ring")
            if not HEADER_BYTES <= st.st_size <= MAX_RING_BYTES:
                raise ProtocolError(f"{self.path} cannot be a ring ({st.st_size} bytes; at most {MAX_RING_BYTES})")
            self._mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._size = fd, st.st_size  # kept open: the size is checked before each pass
        try:
            self._parse(st.st_size, expect_pid)
        except BaseException:
            self._mm.close()
            os.close(fd)
            raise
        self._names_read = 0
        self._names_count = 0
        self._settled: dict[Msg, int] = {t.msg: t.tail for t in self._tables}
        self.reported_drops: dict[Msg, int] = {t.msg: 0 for t in self._tables}
        self.names_dropped_reported = 0

    def _parse(self, size: int, expect_pid: int | None) -> None:
        (magic, version, header, file_bytes, pid, created, n, _state, names_off, names_bytes, inflight_off,
         _r) = _HEAD.unpack_from(self._mm, 0)
        if magic != MAGIC or version != VERSION or header != HEADER_BYTES:
            raise ProtocolError(f"{self.path}: not an Argus ring of version {VERSION}")
        if file_bytes != size or not 0 < n <= 16:
            raise ProtocolError(f"{self.path}: header says {file_bytes} bytes and {n} tables; the file has {size}")
        if expect_pid is not None and pid != expect_pid:
            raise ProtocolError(f"{self.path} was written by pid {pid}, not {expect_pid}")

        def inside(off: int, length: int) -> bool:
            return HEADER_BYTES <= off and off + length <= size

        if not inside(names_off, names_bytes) or names_bytes < NAMES_HEADER or not inside(inflight_off, BLOCK_BYTES):
            raise ProtocolError(f"{self.path}: names or in-flight area outside the file")
        self.pid, self.created_ns = pid, created
        self._names_off, self._names_bytes = names_off, names_bytes
        self.inflight = _CheckedInflight(self._mm, inflight_off, self.check_size)
        self._tables: list[_Table] = []
        for i in range(n):
            msg, rec, cap, data, ctr, _ = _DIR.unpack_from(self._mm, _HEAD.size + i * _DIR.size)
            try:
                m = Msg(msg)
                dtype = DTYPES[m]
            except (ValueError, KeyError):
                raise ProtocolError(f"{self.path}: table {i} has unknown message type {msg}") from None
            if rec != dtype.itemsize or cap == 0 or not inside(data, rec * cap) or not inside(ctr, 64):
                raise ProtocolError(f"{self.path}: table {m.name} does not fit the file")
            t = _Table(m, rec, cap, data, ctr)
            t.tail = _U64.unpack_from(self._mm, ctr + 8)[0]
            self._tables.append(t)

    def check_size(self) -> None:
        """:class:`ProtocolError` if the file shrank since it was mapped: touching a page past
        its end would kill the processor with SIGBUS, so a truncated ring is never read again."""
        try:
            size = os.fstat(self._fd).st_size
        except (OSError, ValueError) as exc:
            raise ProtocolError(f"{self.path}: cannot check the ring's size ({exc})") from None
        if size < self._size:
            raise ProtocolError(f"{self.path} shrank from {self._size} to {size} bytes; no longer reading it")

    @property
    def closed_by_writer(self) -> bool:
        try:
            self.check_size()
        except ProtocolError:
            return False
        return _U32.unpack_from(self._mm, 44)[0] == STATE_CLOSED

    def new_names(self) -> list[str]:
        """Names published since the last call, in id order."""
        self.check_size()
        used, count = _U64X2.unpack_from(self._mm, self._names_off)
        out: list[str] = []
        pos = self._names_read
        limit = min(used, self._names_bytes - NAMES_HEADER)
        base = self._names_off + NAMES_HEADER
        while (self._names_count + len(out) < count and pos + _U32.size <= limit
               and len(out) < MAX_NAMES_PER_PASS):
            (length,) = _U32.unpack_from(self._mm, base + pos)
            if pos + _U32.size + length > limit:
                break
            out.append(bytes(self._mm[base + pos + _U32.size:base + pos + _U32.size + length]).decode("utf-8",
                                                                                                      "replace"))
            pos += _U32.size + length
        self._names_read = pos
        self._names_count += len(out)
        return out

    def drain(self, settled: bool = True) -> dict[Msg, np.ndarray]:
        """Copy out every record not yet consumed and release its space. With ``settled`` only
        records published before the previous call (see the module docstring)."""
        self.check_size()
        out = {}
        mm = self._mm
        for t in self._tables:
            head = _U64.unpack_from(mm, t.ctr)[0]
            upto = min(self._settled[t.msg], head) if settled else head
            self._settled[t.msg] = head
            if upto - t.tail > t.cap:  # never written by a well-behaved writer: resynchronise
                t.tail = upto - t.cap
            n = upto - t.tail
            if n <= 0:
                continue
            view = np.frombuffer(mm, t.dtype, count=t.cap, offset=t.data)
            pos = t.tail % t.cap
            first = min(n, t.cap - pos)
            recs = view[pos:pos + first].copy() if n == first else np.concatenate(
                [view[pos:pos + first], view[:n - first]])
            del view
            t.tail = upto
            _U64.pack_into(mm, t.ctr + 8, upto)
            out[t.msg] = recs
        return out

    def new_drops(self) -> dict[Msg, int]:
        """Records the writer refused (full ring) since the last call, per table."""
        self.check_size()
        out = {}
        for t in self._tables:
            total = _U64.unpack_from(self._mm, t.ctr + 16)[0]
            if total > self.reported_drops[t.msg]:
                out[t.msg] = total - self.reported_drops[t.msg]
                self.reported_drops[t.msg] = total
        return out

    def close(self, unlink: bool = False) -> None:
        try:
            self._mm.close()
        except (ValueError, OSError, BufferError):
            pass
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if unlink:
            self.path.unlink(missing_ok=True)


class _CheckedInflight(InflightReader):
    """The ring's in-flight block, read only while the file still covers it."""

    def __init__(self, mm: Any, offset: int, check: Callable[[], None]):
        super().__init__(mm, offset)
        self._check = check

    def read(self, tries: int = 50) -> Any:
        self._check()
        return super().read(tries)

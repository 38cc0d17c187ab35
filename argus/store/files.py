"""Parquet files of the store: atomic writes and the checks that make foreign files loud.

Every file is written to a hidden temporary name in its final directory and renamed into
place, so a crash leaves either the whole file or a hidden leftover that readers ignore.
Each file carries its table name and schema version in the Parquet key-value metadata.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from argus.errors import StoreError
from argus.store.schema import SCHEMA_VERSION, TABLES

__all__ = ["write_parquet_atomic", "check_table_file", "write_bytes_atomic", "TMP_PREFIX"]

TMP_PREFIX = ".tmp-"
_META_TABLE = b"argus.table"
_META_VERSION = b"argus.schema_version"
_META_WRITER = b"argus.writer"


def write_bytes_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` via temp + rename (``fsync`` first when ``durable``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}-{path.name}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_parquet_atomic(path: Path, table: pa.Table, table_name: str, writer: str,
                         durable: bool = True) -> int:
    """Write one store file; returns its size in bytes. Never overwrites an existing file."""
    if path.exists():
        raise StoreError(f"{path}: already exists; store files are never overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(table.schema.metadata or {})
    meta.update({_META_TABLE: table_name.encode(), _META_VERSION: str(SCHEMA_VERSION).encode(),
                 _META_WRITER: writer.encode()})
    table = table.replace_schema_metadata(meta)
    tmp = path.parent / f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}-{path.name}"
    try:
        pq.write_table(table, tmp, compression="zstd", row_group_size=1 << 20)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path.stat().st_size


def check_table_file(path: Path, table_name: str) -> pq.FileMetaData:
    """Validate that ``path`` is an Argus file of ``table_name`` this version can read.

    Raises :class:`StoreError` naming the file and what is wrong with it."""
    if path.suffix != ".parquet":
        raise StoreError(f"{path}: foreign file in table {table_name!r} (only *.parquet files written by "
                         "Argus belong here); move it out of the store")
    try:
        meta = pq.read_metadata(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise StoreError(f"{path}: unreadable Parquet file ({exc}); it may be truncated or corrupt — "
                         "move it aside to read the rest of the store") from None
    kv = meta.metadata or {}
    found = kv.get(_META_TABLE)
    if found is None:
        raise StoreError(f"{path}: foreign Parquet file (no Argus table marker) in table {table_name!r}")
    if found.decode() != table_name:
        raise StoreError(f"{path}: file of table {found.decode()!r} found in table {table_name!r}")
    try:
        version = int(kv.get(_META_VERSION, b"0"))
    except ValueError:
        version = 0
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path}: written with store schema v{version}; this Argus reads up to "
                         f"v{SCHEMA_VERSION} — upgrade Argus")
    if version < 1:
        raise StoreError(f"{path}: missing or invalid schema version in file metadata")
    if table_name not in TABLES:
        raise StoreError(f"{path}: unknown table {table_name!r}")
    return meta

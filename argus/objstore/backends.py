"""One interface over a local directory and an S3 bucket prefix.

Keys are ``/``-separated paths relative to the store's root. ``put`` is atomic on both: a
local file is written to a hidden temp name and renamed; an S3 object appears whole or not
at all (one PUT). Listing returns size and modification time, which is all retention and
synchronisation need; ``recursive=False`` lists one "directory" only (S3: one delimited
listing), so a caller can look at its own files of a directory other writers share without
paging through theirs.

``s3://bucket/prefix`` uses boto3 (``pip install 'argus-trace[s3]'``); the endpoint comes
from ``?endpoint=http://HOST:PORT`` on the URI or ``AWS_ENDPOINT_URL``, credentials and
region from the usual ``AWS_*`` environment (a local S3-compatible server needs any
non-empty pair).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol
from urllib.parse import parse_qs, urlparse

from argus.errors import ArgusError, ConfigError
from argus.store.files import TMP_PREFIX, write_bytes_atomic

__all__ = ["ObjectInfo", "ObjectStore", "LocalObjectStore", "S3ObjectStore", "open_objstore", "ObjectStoreError"]


class ObjectStoreError(ArgusError):
    """The object store could not be reached or refused an operation."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch


class ObjectStore(Protocol):
    uri: str

    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def list(self, prefix: str = "", recursive: bool = True) -> list[ObjectInfo]: ...
    def delete(self, key: str) -> bool: ...


def _clean(key: str) -> str:
    parts = [p for p in key.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ConfigError(f"object key {key!r} leaves the store")
    return "/".join(parts)


class LocalObjectStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.uri = str(self.root)

    def put(self, key: str, data: bytes) -> None:
        write_bytes_atomic(self.root / _clean(key), data)

    def get(self, key: str) -> bytes:
        try:
            return (self.root / _clean(key)).read_bytes()
        except FileNotFoundError:
            raise ObjectStoreError(f"{self.uri}: no object {key!r}") from None

    def list(self, prefix: str = "", recursive: bool = True) -> list[ObjectInfo]:
        base = self.root / _clean(prefix) if prefix else self.root
        out = []
        for path in (_walk(base) if recursive else _files(base)):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # removed meanwhile
            out.append(ObjectInfo(path.relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> bool:
        try:
            (self.root / _clean(key)).unlink()
            return True
        except FileNotFoundError:
            return False


def _files(base: Path) -> Iterator[Path]:
    """The files directly in ``base`` (not in its subdirectories), temp files skipped."""
    try:
        entries = list(os.scandir(base))
    except (FileNotFoundError, NotADirectoryError):
        return
    for e in entries:
        if not e.name.startswith(TMP_PREFIX) and e.is_file(follow_symlinks=False):
            yield Path(e.path)


def _walk(base: Path) -> Iterator[Path]:
    if not base.exists():
        return
    for dirpath, _, names in os.walk(base):
        for n in names:
            if not n.startswith(TMP_PREFIX):
                yield Path(dirpath) / n


class S3ObjectStore:
    def __init__(self, bucket: str, prefix: str = "", endpoint: str | None = None, create_bucket: bool = False):
        try:
            import boto3
            import botocore.exceptions
            from botocore.config import Config
        except ImportError:
            raise ConfigError("s3:// needs boto3: pip install 'argus-trace[s3]'") from None
        self.bucket, self.prefix = bucket, _clean(prefix)
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL")
        self._s3 = boto3.client("s3", endpoint_url=endpoint,
                                region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                                config=Config(retries={"max_attempts": 3, "mode": "standard"},
                                              connect_timeout=5, read_timeout=30))
        self._errors = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
        if create_bucket:
            try:
                self._s3.create_bucket(Bucket=bucket)
            except self._errors:
                pass  # exists already (or no right to create: the first put will say so)

    def _key(self, key: str) -> str:
        k = _clean(key)
        return f"{self.prefix}/{k}" if self.prefix else k

    def put(self, key: str, data: bytes) -> None:
        try:
            self._s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except self._errors as exc:
            raise ObjectStoreError(f"{self.uri}: put {key}: {exc}") from exc

    def get(self, key: str) -> bytes:
        try:
            return self._s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self._errors as exc:
            raise ObjectStoreError(f"{self.uri}: get {key}: {exc}") from exc

    def list(self, prefix: str = "", recursive: bool = True) -> list[ObjectInfo]:
        full = self._key(prefix) if prefix else self.prefix
        full = full + "/" if full else ""
        out: list[ObjectInfo] = []
        delimit = {} if recursive else {"Delimiter": "/"}  # one level: deeper keys fold into CommonPrefixes
        try:
            for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full,
                                                                          **delimit):
                for o in page.get("Contents", []):
                    rel = o["Key"][len(self.prefix) + 1:] if self.prefix else o["Key"]
                    out.append(ObjectInfo(rel, int(o["Size"]), o["LastModified"].timestamp()))
        except self._errors as exc:
            raise ObjectStoreError(f"{self.uri}: list {prefix!r}: {exc}") from exc
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> bool:
        try:
            self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except self._errors as exc:
            raise ObjectStoreError(f"{self.uri}: delete {key}: {exc}") from exc


def open_objstore(uri: str | Path, create_bucket: bool = False) -> ObjectStore:
    """A local path (or ``file://``) or ``s3://bucket/prefix[?endpoint=URL]``."""
    text = str(uri)
    if text.startswith("s3://"):
        u = urlparse(text)
        if not u.netloc:
            raise ConfigError(f"{text}: an s3:// URI needs a bucket (s3://bucket/prefix)")
        endpoint = parse_qs(u.query).get("endpoint", [None])[0]
        return S3ObjectStore(u.netloc, u.path, endpoint, create_bucket)
    if text.startswith("file://"):
        text = urlparse(text).path
    if "://" in text:
        raise ConfigError(f"{text}: unsupported object store (use a path or s3://bucket/prefix)")
    return LocalObjectStore(text)

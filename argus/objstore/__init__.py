"""Object storage for the store's Parquet partitions and evidence files: one interface over
a local directory and ``s3://bucket/prefix``, with atomic puts, append-only synchronisation
and the same evidence retention as on disk."""

from argus.objstore.backends import (LocalObjectStore, ObjectInfo, ObjectStore, ObjectStoreError, S3ObjectStore,
                                     open_objstore)
from argus.objstore.sync import Mirror, SyncStats, enforce_remote_retention, local_copy, pull, push

__all__ = ["LocalObjectStore", "Mirror", "ObjectInfo", "ObjectStore", "ObjectStoreError", "S3ObjectStore",
           "SyncStats", "enforce_remote_retention", "local_copy", "open_objstore", "pull", "push"]

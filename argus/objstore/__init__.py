"""Object storage for the store's Parquet partitions and evidence files: one interface over
a local directory and ``s3://bucket/prefix``, with atomic puts, append-only synchronisation,
a live mirror that keeps a ledger instead of listing the bucket, and evidence retention in the
bucket per host."""

from argus.objstore.backends import (LocalObjectStore, ObjectInfo, ObjectStore, ObjectStoreError, S3ObjectStore,
                                     open_objstore)
from argus.objstore.ledger import MIRROR_STATE_DIR, Ledger, LedgerEntry
from argus.objstore.mirror import Mirror
from argus.objstore.sync import (SyncStats, enforce_remote_retention, evidence_host, evidence_prefixes, local_copy,
                                 plan_retention, pull, push)

__all__ = ["Ledger", "LedgerEntry", "LocalObjectStore", "MIRROR_STATE_DIR", "Mirror", "ObjectInfo", "ObjectStore",
           "ObjectStoreError", "S3ObjectStore", "SyncStats", "enforce_remote_retention", "evidence_host",
           "evidence_prefixes", "local_copy", "open_objstore", "plan_retention", "pull", "push"]

"""One run attempt in the store: its metadata, its writers and its reader.

On disk (``<store>/runs/<run_id>/<attempt_id>/``)::

    attempt.json                       identity, layout, rank order, source, creation time
    <table>/<writer>/<window>-<nonce>.parquet

``<writer>`` is the partition of one producer of files: a processor writes under its host
name, the simulator under ``sim``, an importer under its own name. Files are append-only:
a new window is a new file, nothing is ever rewritten.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.dataset as ds

from argus.errors import StoreError
from argus.store.files import TMP_PREFIX, check_table_file, write_bytes_atomic, write_parquet_atomic
from argus.store.schema import TABLES, conform
from argus.topology import Layout, RunIdentity, Topology, parse_layout

__all__ = ["Attempt", "AttemptWriter", "ATTEMPT_META"]

ATTEMPT_META = "attempt.json"


@dataclass(frozen=True)
class TableStats:
    files: int
    rows: int
    bytes: int


class Attempt:
    """Reader and writer factory for one ``(run_id, attempt_id)`` directory."""

    def __init__(self, path: Path, meta: Mapping[str, Any]):
        self.path = Path(path)
        self.meta = dict(meta)
        self.identity = RunIdentity(self.meta["run_id"], self.meta["attempt_id"])
        self.layout: Layout = parse_layout(self.meta["layout"], order=self.meta.get("order"))
        self._checked: dict[Path, tuple[float, int]] = {}

    # -- creation ----------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, identity: RunIdentity, topology: Topology | Layout, source: str,
               extra: Mapping[str, Any] | None = None) -> "Attempt":
        """Create the attempt directory. With a full :class:`Topology` its rows are written
        now; with only a :class:`Layout` each writer adds its own ranks' rows later."""
        layout = topology.layout if isinstance(topology, Topology) else topology
        meta = {
            "run_id": identity.run_id,
            "attempt_id": identity.attempt_id,
            "layout": str(layout),
            "order": layout.order_str,
            "world_size": layout.world_size,
            "source": source,
            "created_ns": time.time_ns(),
            **(extra or {}),
        }
        # Staged, then renamed into place: hosts sharing a store create the attempt at the same
        # moment, and none may see its directory before its attempt.json.
        if path.exists():
            raise FileExistsError(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.parent / f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}-{path.name}"
        staged.mkdir()
        try:
            write_bytes_atomic(staged / ATTEMPT_META, json.dumps(meta, indent=2).encode())
            try:
                os.rename(staged, path)  # fails if another writer's attempt is already there
            except OSError as exc:
                if path.is_dir():
                    raise FileExistsError(path) from exc
                raise
        finally:
            if staged.exists():
                shutil.rmtree(staged, ignore_errors=True)
        attempt = cls(path, meta)
        if isinstance(topology, Topology):
            attempt.writer("meta").write("topology", topology.to_table(), window=topology.version)
        return attempt

    @classmethod
    def open(cls, path: Path) -> "Attempt":
        meta_path = path / ATTEMPT_META
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            raise StoreError(f"{meta_path}: missing; {path} is not an Argus run attempt") from None
        except (OSError, ValueError) as exc:
            raise StoreError(f"{meta_path}: unreadable attempt metadata ({exc})") from None
        for key in ("run_id", "attempt_id", "layout"):
            if key not in meta:
                raise StoreError(f"{meta_path}: attempt metadata lacks {key!r}")
        return cls(path, meta)

    def update_meta(self, **values: Any) -> None:
        """Record extra facts about the attempt (e.g. the scenario a simulation used)."""
        self.meta.update(values)
        write_bytes_atomic(self.path / ATTEMPT_META, json.dumps(self.meta, indent=2).encode())

    # -- writing -----------------------------------------------------------------------
    def writer(self, writer_id: str, durable: bool = True) -> "AttemptWriter":
        return AttemptWriter(self, writer_id, durable)

    # -- reading -----------------------------------------------------------------------
    def files(self, table: str) -> list[Path]:
        """Every committed file of ``table``, validated; hidden temp leftovers are skipped."""
        if table not in TABLES:
            raise StoreError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
        root = self.path / table
        if not root.exists():
            return []
        out: list[Path] = []
        for writer_dir in sorted(root.iterdir()):
            if writer_dir.name.startswith("."):
                continue
            if not writer_dir.is_dir():
                raise StoreError(f"{writer_dir}: foreign file in table {table!r} (expected writer directories)")
            for f in sorted(writer_dir.iterdir()):
                if f.name.startswith("."):
                    continue  # temp files of an in-flight or crashed write
                stat = f.stat()
                key = (stat.st_mtime, stat.st_size)
                if self._checked.get(f) != key:
                    check_table_file(f, table)
                    self._checked[f] = key
                out.append(f)
        return out

    def read(self, table: str, columns: list[str] | None = None,
             steps: tuple[int, int] | None = None, filter: ds.Expression | None = None) -> pa.Table:
        """Read ``table`` (optionally a column subset, an inclusive step range, a filter)."""
        files = self.files(table)  # validates the table name
        spec = TABLES[table]
        schema = spec.schema
        if not files:
            empty = schema.empty_table()
            return empty.select(columns) if columns else empty
        expr = filter
        if steps is not None:
            if spec.step_column is None:
                raise StoreError(f"table {table!r} has no step column to filter on")
            col = ds.field(spec.step_column)
            rng = (col >= steps[0]) & (col <= steps[1])
            expr = rng if expr is None else (expr & rng)
        try:
            dataset = ds.dataset([str(f) for f in files], schema=schema, format="parquet")
            return dataset.to_table(columns=columns, filter=expr)
        except pa.ArrowInvalid as exc:
            raise StoreError(f"{self.path / table}: cannot read table ({exc})") from None

    def topology(self) -> Topology:
        return Topology.from_table(self.read("topology"), self.layout)

    def stats(self) -> dict[str, TableStats]:
        import pyarrow.parquet as pq

        out = {}
        for table in TABLES:
            files = self.files(table)
            rows = sum(pq.read_metadata(f).num_rows for f in files)
            out[table] = TableStats(len(files), rows, sum(f.stat().st_size for f in files))
        return out

    def step_range(self) -> tuple[int, int] | None:
        steps = self.read("steps", columns=["step"]).column("step")
        if len(steps) == 0:
            return None
        arr = steps.to_numpy()
        return int(arr.min()), int(arr.max())

    def duckdb(self, connection: Any = None) -> Any:
        """A DuckDB connection with one view per table (empty tables are empty views)."""
        import duckdb

        con = connection if connection is not None else duckdb.connect()
        for table, spec in TABLES.items():
            files = self.files(table)
            if files:
                rel = con.read_parquet([str(f) for f in files], union_by_name=True)
                rel.create_view(table, replace=True)
            else:
                empty = spec.schema.empty_table()
                con.register(f"_argus_empty_{table}", empty)
                con.execute(f'CREATE OR REPLACE VIEW "{table}" AS SELECT * FROM "_argus_empty_{table}"')
        return con

    def sql(self, query: str) -> pa.Table:
        """Run ``query`` over the attempt's views and return an Arrow table."""
        con = self.duckdb()
        try:
            return con.sql(query).to_arrow_table()
        finally:
            con.close()

    def __repr__(self) -> str:
        return f"Attempt({self.identity.run_id}/{self.identity.attempt_id}, {self.layout}, {self.path})"


class AttemptWriter:
    """Appends windows of rows to an attempt's tables, one atomic file per call."""

    def __init__(self, attempt: Attempt, writer_id: str, durable: bool = True):
        if not writer_id or "/" in writer_id or writer_id.startswith("."):
            raise StoreError(f"writer id {writer_id!r} must be non-empty, without '/' and not start with '.'")
        self.attempt = attempt
        self.writer_id = writer_id
        self.durable = durable
        self.bytes_written = 0

    def write(self, table: str, data: pa.Table | Mapping[str, object], window: int) -> Path | None:
        """Write ``data`` as one new file of ``table`` for ``window``; empty data writes nothing."""
        t = conform(table, data)
        if t.num_rows == 0:
            return None
        path = (self.attempt.path / table / self.writer_id /
                f"{int(window):09d}-{uuid.uuid4().hex[:8]}.parquet")
        self.bytes_written += write_parquet_atomic(path, t, table, self.writer_id, self.durable)
        return path


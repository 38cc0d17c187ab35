"""One run attempt in the store: its metadata, its writers and its reader.

On disk (``<store>/runs/<run_id>/<attempt_id>/``)::

    attempt.json                       identity, layout, rank order, source, creation time
    <table>/<writer>/<window>-<nonce>.parquet

    commits/<writer>/<window>-u<unit>.json   commit records of multi-file windows (see ``commit.py``)

``<writer>`` is the partition of one producer of files: a processor writes under its host
name, the simulator under ``sim``, an importer under its own name. Files are append-only:
a new window is a new file, nothing is ever rewritten.

Reading never fails on what a crash or a stray file leaves: a file that is not a regular
Argus Parquet file of its table (foreign, truncated, zero-byte, a FIFO) is skipped and listed
in :attr:`Attempt.damage`, so analysis runs on the rest and says what it could not read;
:meth:`Attempt.check` turns the list into a :class:`StoreError` for callers that want strictness.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.dataset as ds

from argus.errors import ArgusError, StoreError
from argus.store.commit import WindowUnit, clean_leftovers, committed_units, is_unit_file
from argus.store.files import (TMP_PREFIX, check_table_file, read_regular_bytes, write_bytes_atomic,
                               write_parquet_atomic)
from argus.store.phase_totals import TWIN_OF, TotalsWriter
from argus.store.schema import TABLES, conform
from argus.topology import Layout, RunIdentity, Topology, parse_layout

__all__ = ["Attempt", "AttemptWriter", "ATTEMPT_META", "Damage"]

ATTEMPT_META = "attempt.json"
#: In an attempt: the Flight Recorder dumps its ranks wrote when their host's processor saw the
#: job hang (``rank<N>``, torch's pickle; read by ``analysis/hangs.py``)
FLIGHT_RECORDER_DIR = "flight_recorder"
#: … and the dumps ``argus ingest flight-recorder --store`` brought in after the fact (``rank<N>``
#: and ``set.json``): the diagnosis reads them into its hang (``flight_recorder/stored.py``)
INGESTED_FLIGHT_RECORDER_DIR = "flight_recorder_ingested"
log = logging.getLogger("argus.store")
#: Tables whose rows belong to one rank of the layout: a row with a rank outside it (an old
#: import's -1, a foreign file) is left out by :meth:`Attempt.read`, since analysis indexes
#: per-rank arrays with it. ``drops`` keeps -1 (data from before a rank's handshake).
RANKED_TABLES = frozenset({"steps", "phases", "phase_totals", "kernels", "kernel_summaries", "kernel_sketches", "stacks"})


@dataclass(frozen=True, slots=True)
class Damage:
    """A file readers skipped, and why (the message names the file)."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return self.reason


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
        #: each file validated, by (mtime, size), with the steps its footer says it holds
        self._checked: dict[Path, tuple[tuple[float, int], tuple[int, int] | None]] = {}
        self._damage: dict[Path, Damage] = {}
        self.uncommitted: dict[str, int] = {}  # per table: unit files still waiting for their commit record
        self._queries = threading.local()  # this thread's DuckDB connection for sql()

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
        """Open an existing attempt; a missing, corrupt or foreign ``attempt.json`` is a
        :class:`StoreError` naming the file (never a traceback, never a crash loop)."""
        meta_path = path / ATTEMPT_META
        try:
            meta = json.loads(read_regular_bytes(meta_path))
        except FileNotFoundError:
            raise StoreError(f"{meta_path}: missing; {path} is not an Argus run attempt (a crash while it was "
                             "created, or a stray directory)") from None
        except (OSError, ValueError, RecursionError) as exc:
            raise StoreError(f"{meta_path}: unreadable attempt metadata ({type(exc).__name__}: {exc})"[:500]) from None
        if not isinstance(meta, dict):
            raise StoreError(f"{meta_path}: attempt metadata is not a JSON object")
        for key in ("run_id", "attempt_id", "layout"):
            if not isinstance(meta.get(key), str) or not meta[key]:
                raise StoreError(f"{meta_path}: attempt metadata lacks {key!r} (or it is not a string)")
        if "order" in meta and not isinstance(meta["order"], str):
            raise StoreError(f"{meta_path}: attempt metadata 'order' is not a string")
        try:
            return cls(path, meta)
        except ArgusError as exc:
            raise StoreError(f"{meta_path}: invalid attempt layout ({exc})") from None
        except (ValueError, TypeError, OverflowError) as exc:
            raise StoreError(f"{meta_path}: invalid attempt metadata ({exc})"[:500]) from None

    def update_meta(self, **values: Any) -> None:
        """Record extra facts about the attempt (e.g. the scenario a simulation used)."""
        self.meta.update(values)
        write_bytes_atomic(self.path / ATTEMPT_META, json.dumps(self.meta, indent=2).encode())

    # -- writing -----------------------------------------------------------------------
    def writer(self, writer_id: str, durable: bool = True) -> "AttemptWriter":
        return AttemptWriter(self, writer_id, durable)

    # -- reading -----------------------------------------------------------------------
    def files(self, table: str, steps: tuple[int, int] | None = None) -> list[Path]:
        """Every committed, readable file of ``table`` (with ``steps``, an inclusive range:
        only those whose footer statistics say they may hold one of those steps).

        Skipped: hidden temp leftovers; unit files without their commit record (counted in
        :attr:`uncommitted`); anything that is not a regular Argus file of this table
        (listed in :attr:`damage`). Only regular files are ever opened."""
        if table not in TABLES:
            raise StoreError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
        root = self.path / table
        out: list[Path] = []
        uncommitted = 0
        for writer_dir in self._entries(root):
            if not writer_dir.is_dir() or writer_dir.is_symlink():
                self._damaged(writer_dir, f"{writer_dir}: foreign file in table {table!r} (expected writer "
                                          "directories); move it out of the store")
                continue
            committed: set[str] | None = None
            for f in self._entries(writer_dir):
                if is_unit_file(f) and f.suffix == ".parquet":
                    if committed is None:
                        committed = committed_units(self.path, writer_dir.name)
                    if f.stem not in committed:
                        uncommitted += 1
                        continue  # a window still being written, or one a crash cut short
                try:
                    stat = f.lstat()
                    key = (stat.st_mtime, stat.st_size)
                    checked = self._checked.get(f)
                    if checked is None or checked[0] != key:
                        checked = self._checked[f] = (key, _step_range(check_table_file(f, table), table))
                except StoreError as exc:
                    self._damaged(f, str(exc))
                    continue
                except OSError as exc:  # removed or made unreadable meanwhile
                    self._damaged(f, f"{f}: cannot read ({exc.strerror or exc})")
                    continue
                if f in self._damage:
                    continue  # its data pages failed to decode earlier
                held = checked[1]
                if steps is not None and held is not None and (held[1] < steps[0] or held[0] > steps[1]):
                    continue
                out.append(f)
        self.uncommitted[table] = uncommitted
        return out

    @staticmethod
    def _entries(directory: Path) -> list[Path]:
        try:
            names = sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StoreError(f"{directory}: cannot list ({exc.strerror or exc})") from None
        return [directory / n for n in names if not n.startswith(".")]  # temp files of in-flight or crashed writes

    def _damaged(self, path: Path, reason: str) -> None:
        if path not in self._damage:
            log.warning("skipping %s", reason)
            self._damage[path] = Damage(path, reason)

    @property
    def damage(self) -> list[Damage]:
        """Files skipped so far because they cannot be read as what their place says."""
        return list(self._damage.values())

    def check(self) -> None:
        """Raise :class:`StoreError` naming the damaged files of every table (strict callers)."""
        for table in TABLES:
            self.files(table)
        if self._damage:
            first = next(iter(self._damage.values()))
            more = f" (and {len(self._damage) - 1} more)" if len(self._damage) > 1 else ""
            raise StoreError(f"{first}{more}")

    def scan_data(self) -> list[Damage]:
        """Decode every file of every table in full and mark those whose data pages fail
        (a footer can be intact over corrupt pages). Costs a full read: callers use it only
        after a read failed, to find the file and go on without it."""
        import pyarrow.parquet as pq

        found = []
        for table in TABLES:
            for f in self.files(table):
                try:
                    pq.read_table(f, schema=TABLES[table].schema)
                except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for corrupt pages
                    self._damaged(f, f"{f}: corrupt Parquet data ({type(exc).__name__}: {exc})"[:400])
                    found.append(self._damage[f])
        return found

    def read(self, table: str, columns: list[str] | None = None,
             steps: tuple[int, int] | None = None, filter: ds.Expression | None = None,  # noqa: A002 - pyarrow's name for it
             dictionaries: tuple[str, ...] = ()) -> pa.Table:
        """Read ``table`` (optionally a column subset, an inclusive step range, a filter).
        ``dictionaries``: string columns read as dictionaries (a window's kernel names: 1.3 M
        strings of a few hundred values at 10,240 ranks, decoded, copied and encoded again)."""
        spec = TABLES.get(table)
        files = self.files(table, steps=steps if spec is not None and spec.step_column else None)
        assert spec is not None  # files() raised for an unknown table
        schema = spec.schema
        fmt: str | ds.ParquetFileFormat = "parquet"
        if dictionaries:
            for c in dictionaries:
                schema = schema.set(schema.get_field_index(c), pa.field(c, pa.dictionary(pa.int32(), pa.string())))
            fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=list(dictionaries)))
        if not files:
            empty = schema.empty_table()
            return empty.select(columns) if columns else empty
        expr = filter
        if table in RANKED_TABLES:  # a row of no rank of this layout (-1, past the world) indexes nothing
            rank = ds.field("rank")
            valid = (rank >= 0) & (rank < self.layout.world_size)
            expr = valid if expr is None else (expr & valid)
        if steps is not None:
            if spec.step_column is None:
                raise StoreError(f"table {table!r} has no step column to filter on")
            col = ds.field(spec.step_column)
            rng = (col >= steps[0]) & (col <= steps[1])
            expr = rng if expr is None else (expr & rng)
        try:
            dataset = ds.dataset([str(f) for f in files], schema=schema, format=fmt)
            return dataset.to_table(columns=columns, filter=expr)
        except (pa.ArrowException, OSError, ValueError):
            pass  # one file's data pages are corrupt: find it, read the rest
        parts = []
        for f in files:
            try:
                parts.append(ds.dataset(str(f), schema=schema, format=fmt).to_table(columns=columns, filter=expr))
            except (pa.ArrowException, OSError, ValueError) as exc:
                self._damaged(f, f"{f}: corrupt Parquet data ({type(exc).__name__}: {exc})"[:400])
        if not parts:
            empty = schema.empty_table()
            return empty.select(columns) if columns else empty
        return pa.concat_tables(parts)

    def topology(self) -> Topology:
        return Topology.from_table(self.read("topology"), self.layout)

    def stats(self) -> dict[str, TableStats]:
        import pyarrow.parquet as pq

        out = {}
        for table in TABLES:
            files = self.files(table)  # footers already validated
            rows = sum(pq.read_metadata(f).num_rows for f in files)
            out[table] = TableStats(len(files), rows, sum(f.stat().st_size for f in files))
        return out

    def step_range(self) -> tuple[int, int] | None:
        steps = self.read("steps", columns=["step"]).column("step")
        if len(steps) == 0:
            return None
        arr = steps.to_numpy()
        return int(arr.min()), int(arr.max())

    def duckdb(self, connection: Any = None, tables: Iterable[str] | None = None,
               steps: tuple[int, int] | None = None) -> Any:
        """A DuckDB connection with one view per table (empty tables are empty views), or per
        table of ``tables`` only: a view reads every footer of its files (``union_by_name``),
        and a query of one table over a long run's hundreds of files need not pay for all.
        ``steps`` (inclusive): the views of tables with a step column hold the files that may
        hold those steps, and maybe other steps of theirs (the query still filters): a
        window's query binds and opens its own few files, not the run's hundreds."""
        import duckdb

        con = connection if connection is not None else duckdb.connect()
        for table in (TABLES if tables is None else tables):
            spec = TABLES[table]
            files = self.files(table, steps=steps if spec.step_column else None)
            if files:
                rel = con.read_parquet([str(f) for f in files], union_by_name=True)
                rel.create_view(table, replace=True)
            else:
                empty = spec.schema.empty_table()
                con.register(f"_argus_empty_{table}", empty)
                con.execute(f'CREATE OR REPLACE VIEW "{table}" AS SELECT * FROM "_argus_empty_{table}"')
        return con

    def sql(self, query: str) -> pa.Table:
        """Run ``query`` over the attempt's views of the tables it names and return an Arrow
        table. A file whose data pages fail to decode is found (:meth:`scan_data`), set aside
        and the query run again."""
        import duckdb

        named = [t for t in TABLES if re.search(rf'\b{t}\b', query)]
        con = self._connection()
        for _ in range(2):
            try:
                return self.duckdb(con, tables=named).sql(query).to_arrow_table()
            except duckdb.IOException as exc:
                if not self.scan_data():
                    raise StoreError(f"{self.path}: cannot read the attempt ({exc})"[:500]) from None
        return self.duckdb(con, tables=named).sql(query).to_arrow_table()

    def _connection(self) -> Any:
        """This thread's DuckDB connection for :meth:`sql`, kept: a connect costs ~15 ms and a
        diagnosis runs ~20 queries (13% of one). Each query still re-creates its views, so files
        written or set aside since are seen. Per thread and per process: a connection is neither
        thread- nor fork-safe."""
        import duckdb

        held = getattr(self._queries, "held", None)
        if held is None or held[0] != os.getpid():
            held = self._queries.held = (os.getpid(), duckdb.connect())
        return held[1]

    def __repr__(self) -> str:
        return f"Attempt({self.identity.run_id}/{self.identity.attempt_id}, {self.layout}, {self.path})"


class AttemptWriter:
    """Appends windows of rows to an attempt's tables: one atomic file per :meth:`write`, or
    several committed together through :meth:`unit`."""

    def __init__(self, attempt: Attempt, writer_id: str, durable: bool = True):
        if not writer_id or "/" in writer_id or writer_id.startswith("."):
            raise StoreError(f"writer id {writer_id!r} must be non-empty, without '/' and not start with '.'")
        self.attempt = attempt
        self.writer_id = writer_id
        self.durable = durable
        self.bytes_written = 0
        self._totals = TotalsWriter()  # phases files' twins, on one connection
        # the partition is ours: what a killed predecessor left in it goes (old enough only)
        clean_leftovers(attempt.path, writer_id, list(TABLES))

    def unit(self, window: int) -> WindowUnit:
        """A multi-file window whose files become visible together on ``commit()``."""
        return WindowUnit(self.attempt.path, self.writer_id, window, self.durable, totals=self._totals)

    def write(self, table: str, data: pa.Table | Mapping[str, object], window: int) -> Path | None:
        """Write ``data`` as one new file of ``table`` for ``window``; empty data writes nothing."""
        t = conform(table, data)
        if t.num_rows == 0:
            return None
        path = (self.attempt.path / table / self.writer_id /
                f"{int(window):09d}-{uuid.uuid4().hex[:8]}.parquet")
        self.bytes_written += write_parquet_atomic(path, t, table, self.writer_id, self.durable)
        if table == TWIN_OF:  # its aggregates, after it: a crash between leaves a phases file without, read raw
            self.bytes_written += write_parquet_atomic(self.attempt.path / "phase_totals" / self.writer_id / path.name,
                                                       self._totals(t), "phase_totals", self.writer_id, self.durable)
        return path



def _step_range(meta: Any, table: str) -> tuple[int, int] | None:
    """The steps a file may hold, from its footer: the least of ``table``'s step column and the
    greatest of ``end_step`` where the table spans steps (kernel summaries), else of the step
    column. None where the table has no step column or a row group lacks statistics."""
    first = TABLES[table].step_column
    if first is None or meta.num_row_groups == 0:
        return None
    names = meta.schema.names
    last = "end_step" if "end_step" in names else first
    if first not in names:
        return None
    lo, hi = _extreme(meta, names.index(first), min), _extreme(meta, names.index(last), max)
    return None if lo is None or hi is None else (int(lo), int(hi))


def _extreme(meta: Any, column: int, pick: Any) -> Any:
    """``pick`` (min or max) of one column's statistics over all row groups; None if any lacks them."""
    out = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max:
            return None
        value = stats.min if pick is min else stats.max
        out = value if out is None else pick(out, value)
    return out


class JoinedAttempt(Attempt):
    """One job that was written as several runs (its hosts' ``argus run`` started seconds apart
    and, before the ranks agreed on a run id, each named the job itself): the parts' files read
    as one attempt. Writes (the diagnosis' incidents) go to the first part."""

    def __init__(self, parts: list[Attempt]):
        super().__init__(parts[0].path, {**parts[0].meta, "joined_runs": [p.identity.run_id for p in parts]})
        self.parts = parts

    def files(self, table: str, steps: tuple[int, int] | None = None) -> list[Path]:
        out = [f for p in self.parts for f in p.files(table, steps)]
        self.uncommitted[table] = sum(p.uncommitted.get(table, 0) for p in self.parts)
        return out

    @property
    def damage(self) -> list[Damage]:
        return [d for p in self.parts for d in p.damage]

    def scan_data(self) -> list[Damage]:
        return [d for p in self.parts for d in p.scan_data()]

    def __repr__(self) -> str:
        return f"JoinedAttempt({', '.join(repr(p) for p in self.parts)})"

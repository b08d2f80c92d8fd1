"""An Apache Iceberg table as a source (`pyiceberg`): bounded or continuous.

The table's snapshot at `snapshot_id` (default: the current one when the pipeline is built) is
read first; bounded, the source then ends, continuous, it goes on with every snapshot committed
after it on the main branch, in order of their sequence numbers (the "versions" of
`table_source.py`, which is why continuous reading needs a format-version 2 table). Each data
file is a split checkpointed with its row position: after a failover every row is emitted
exactly once, whatever the parallelism of the restored job.

`catalog` is what `pyiceberg.catalog.load_catalog` takes — a dict of properties (`type`, `uri`,
`warehouse`, credentials…, and an optional `name`) — or a catalog object, whose name and
properties are used; each reader loads the catalog again from them on its worker. Data files are
read through the table's FileIO, so the catalog's storage properties apply.

Snapshots with row-level deletes (merge-on-read delete files) cannot be read file by file: a
snapshot to read first that has them is refused at build time, a later one is a change commit.
"""

from __future__ import annotations

import pyarrow as pa

from streamsnap.connectors.lakehouse.table_source import NewVersion, TableLog, TableSource
from streamsnap.errors import ConfigurationError, StreamsnapError


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def catalog_properties(catalog, where: str) -> tuple[str, dict]:
    """(name, properties) to load the catalog with, from a dict or a pyiceberg catalog object."""
    if catalog is None:
        raise ConfigurationError(
            f"{where}: catalog= is missing; pass the properties pyiceberg's load_catalog takes, e.g. "
            f"{{'type': 'sql', 'uri': 'sqlite:////path/catalog.db', 'warehouse': 'file:///path'}} "
            f"or {{'type': 'rest', 'uri': 'http://...'}}, or a pyiceberg catalog object")
    if isinstance(catalog, dict):
        properties = {str(k): v for k, v in catalog.items()}
        name = str(properties.pop("name", "default"))
        if not properties:
            raise ConfigurationError(f"{where}: catalog= is an empty dict; give at least its 'type' and 'uri'")
        return name, properties
    if hasattr(catalog, "load_table") and hasattr(catalog, "properties"):
        return str(catalog.name), dict(catalog.properties)
    raise ConfigurationError(
        f"{where}: catalog= must be a dict of catalog properties or a pyiceberg catalog, got {type(catalog).__name__}")


def load_catalog(name: str, properties: dict, where: str):
    from pyiceberg.catalog import load_catalog as load

    try:
        return load(name, **properties)
    except Exception as exc:
        raise ConfigurationError(
            f"{where}: the catalog {name!r} ({properties.get('type', 'type not given')}) cannot be "
            f"loaded: {_describe(exc)}; check catalog=") from exc


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """The Arrow schema without pyiceberg's field-id metadata."""
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])


class IcebergSource(TableSource):
    """Rows of an Iceberg table: one snapshot (bounded) or it and every later append.

    table: the table identifier, "namespace.table".
    catalog: the catalog's properties (a dict for pyiceberg's load_catalog, with an optional
      "name") or a pyiceberg catalog object.
    snapshot_id: the snapshot read first; None: the current snapshot when the pipeline is built.
    bounded, event_time, max_out_of_orderness, skip_change_commits, poll_interval, batch_size:
      as for ss.sources.Delta (a change commit is a snapshot whose operation is "overwrite" or
      "delete"; "replace" snapshots — compaction — are skipped).
    """

    label = "Iceberg"

    def __init__(self, table: str, catalog=None, snapshot_id: int | None = None, *, bounded: bool = True,
                 event_time: str | None = None, max_out_of_orderness=0, skip_change_commits: bool = False,
                 poll_interval: float = 1.0, batch_size: int = 4096):
        if not isinstance(table, str) or "." not in table.strip(". "):
            raise ConfigurationError(f"Iceberg.table must be an identifier 'namespace.table', got {table!r}")
        if snapshot_id is not None and (isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int)):
            raise ConfigurationError(f"Iceberg.snapshot_id must be a snapshot id (an integer) or None, got {snapshot_id!r}")
        self.catalog_name, self.catalog_properties = catalog_properties(catalog, "Iceberg")
        super().__init__(bounded=bounded, event_time=event_time, max_out_of_orderness=max_out_of_orderness,
                         skip_change_commits=skip_change_commits, poll_interval=poll_interval,
                         batch_size=batch_size)
        self.table = table.strip()
        self.snapshot_id = snapshot_id

    def load_table(self):
        """The pyiceberg Table, loaded from the catalog anew (on the driver or a worker);
        ConfigurationError naming the table or catalog when that fails."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        catalog = load_catalog(self.catalog_name, self.catalog_properties, "Iceberg")
        try:
            return catalog.load_table(self.table)
        except (NoSuchTableError, NoSuchNamespaceError) as exc:
            raise ConfigurationError(
                f"Iceberg: the table {self.table!r} does not exist in the catalog {self.catalog_name!r} "
                f"({_describe(exc)}); check table= and catalog=") from exc
        except Exception as exc:
            raise ConfigurationError(
                f"Iceberg: the table {self.table!r} cannot be loaded from the catalog "
                f"{self.catalog_name!r}: {_describe(exc)}") from exc

    def _load(self):
        table = self.load_table()
        if not self.bounded and table.metadata.format_version < 2:
            raise ConfigurationError(
                f"Iceberg: {self.table!r} is a format-version {table.metadata.format_version} table; "
                f"reading it continuously (bounded=False) needs format version 2, whose snapshots "
                f"carry sequence numbers (upgrade the table, or read it bounded)")
        if self.snapshot_id is not None:
            snapshot = table.snapshot_by_id(self.snapshot_id)
            if snapshot is None:
                known = [s.snapshot_id for s in table.snapshots()][-5:]
                raise ConfigurationError(
                    f"Iceberg: snapshot_id={self.snapshot_id} is not a snapshot of {self.table!r} "
                    f"(latest snapshots: {known})")
        else:
            snapshot = table.current_snapshot()
        schema = plain_schema(table.schema().as_arrow())
        if snapshot is None:      # a table without any snapshot holds no rows yet
            return schema, 0, []
        if snapshot.schema_id is not None and snapshot.schema_id != table.schema().schema_id:
            schema = plain_schema(table.schemas()[snapshot.schema_id].as_arrow())
        files = []
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            if task.delete_files:
                raise ConfigurationError(
                    f"Iceberg: snapshot {snapshot.snapshot_id} of {self.table!r} has row-level delete "
                    f"files (for {task.file.file_path}); this source reads data files whole — rewrite "
                    f"the table's data files (compaction) or read another snapshot")
            files.append([task.file.file_path, {}])
        files.sort(key=lambda f: f[0])
        return schema, snapshot.sequence_number or 0, files

    def open_table(self) -> TableLog:
        return IcebergLog(self)

    def __repr__(self) -> str:
        mode = "bounded" if self.bounded else "continuous"
        return f"Iceberg({self.table!r}, catalog={self.catalog_name!r}, {mode})"


class IcebergLog(TableLog):
    """A worker's access to an Iceberg table: its snapshots and its data files."""

    def __init__(self, source: IcebergSource):
        self._source = source
        self._table = source.load_table()
        self._schema = source.schema

    def filesystem(self):
        return _IcebergFiles(self._table.io)

    def file_schema(self) -> pa.Schema:
        return self._schema

    def conform(self, batch: pa.RecordBatch, partition: dict) -> pa.RecordBatch:
        return batch

    def versions_from(self, version: int, limit: int) -> list[NewVersion]:
        from pyiceberg.table.snapshots import ancestors_of

        table = self._table
        table.refresh()
        current = table.current_snapshot()
        if current is None:
            return []
        newer = []
        for snapshot in ancestors_of(current, table.metadata):
            if (snapshot.sequence_number or 0) < version:
                break
            newer.append(snapshot)
        newer.sort(key=lambda s: s.sequence_number)
        return [self._classify(s) for s in newer[:limit]]

    def _classify(self, snapshot) -> NewVersion:
        from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

        table, version = self._table, snapshot.sequence_number
        operation = snapshot.summary.operation.value if snapshot.summary is not None else "unknown"
        if snapshot.schema_id is not None:
            names = table.schemas()[snapshot.schema_id].column_names
            if names != self._schema.names:
                raise StreamsnapError(
                    f"Iceberg: snapshot {snapshot.snapshot_id} (sequence number {version}) of "
                    f"{self._source.table!r} changed the columns to {names} (the stream has "
                    f"{self._schema.names}); start a new job on the new schema (snapshot_id="
                    f"{snapshot.snapshot_id})")
        if operation == "replace":
            return NewVersion(version, [])
        added, deletes = [], 0
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status != ManifestEntryStatus.ADDED or entry.snapshot_id != snapshot.snapshot_id:
                    continue
                if manifest.content == ManifestContent.DELETES or entry.data_file.content != DataFileContent.DATA:
                    deletes += 1
                else:
                    added.append([entry.data_file.file_path, {}])
        change = None
        if operation != "append" or deletes:
            change = (f"is a {operation!r} snapshot ({snapshot.snapshot_id}) that removes or rewrites data"
                      f"{f' ({deletes} delete file(s))' if deletes else ''}")
        return NewVersion(version, sorted(added), change)


class _IcebergFiles:
    """`open(path, "rb")` through the table's FileIO, as files.FileCursor reads files."""

    def __init__(self, io):
        self._io = io

    def open(self, path: str, mode: str = "rb", **_):
        return self._io.new_input(path).open(seekable=True)

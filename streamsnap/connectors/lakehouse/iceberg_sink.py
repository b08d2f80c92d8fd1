"""`ss.sinks.Iceberg`: an Apache Iceberg table written exactly-once, one snapshot per completed checkpoint.

The same protocol as the Delta sink (`committer.py`): writers write Parquet data files under the
table's `data/` location, and the global committer on the JobMaster appends a checkpoint's files
in one snapshot (`Transaction.add_files`, which reads each file's footer for Iceberg's column
metrics and partition values). Idempotence as Flink's Iceberg sink has it: the snapshot summary
records `streamsnap.committed.<app id> = <checkpoint id>`, and before a commit the committer
reads the latest such value of every app from the table's snapshots, so a commit repeated
after a failover adds nothing twice.

The catalog is given as the properties `pyiceberg.catalog.load_catalog` takes (a dict with
`type`, `uri`, `warehouse`, ... and an optional `name`) or as a catalog object, whose name and
properties are kept: the committer reloads it on the JobMaster, which in cluster mode runs in
another process. The table is created at `execute()` if missing (the stream's schema and
`partition_by` as identity partitions) — it must exist before the writers start, since its
location is where they write. Iceberg keeps partition source columns in the data files.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any

import pyarrow as pa

from streamsnap.checkpoint import filesystem
from streamsnap.connectors.base import SinkWriter
from streamsnap.connectors.lakehouse.committer import Commit, GlobalCommitter, TableCommitter
from streamsnap.connectors.lakehouse.data_files import TARGET_FILE_SIZE, delete_unreferenced, file_prefix, widest_schema
from streamsnap.connectors.lakehouse.table_sink import TableSink, schema_problem, to_table_types
from streamsnap.connectors.lakehouse.writer import LakeWriter
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.operators.base import OperatorContext

log = logging.getLogger(__name__)

SUMMARY_PREFIX = "streamsnap.committed."


class Iceberg(TableSink):
    """Writes the stream into the Iceberg table `table` ("namespace.name") of `catalog`,
    exactly-once with checkpoints: one snapshot per completed checkpoint.

    catalog: `pyiceberg.catalog.load_catalog` properties (dict; "name" optional), or a catalog object.
    partition_by: identity partition columns of a new table (an existing table's must agree; None adopts them).
    schema_mode: "error" (default) refuses stream columns the table lacks, naming them; "merge" adds them.
    target_file_size: bytes after which a data file rolls (it also closes at every checkpoint).
    """

    def __init__(self, table: str, catalog: Any, partition_by: list[str] | str | None = None, *,
                 schema_mode: str = "error", target_file_size: int = TARGET_FILE_SIZE):
        try:
            import pyiceberg  # noqa: F401
        except ImportError:
            raise ConfigurationError("ss.sinks.Iceberg needs the pyiceberg package: "
                                     "pip install 'streamsnap[lakehouse]'") from None
        if not isinstance(table, str) or "." not in table.strip("."):
            raise ConfigurationError(f"Iceberg.table must be 'namespace.name', got {table!r}")
        super().__init__(partition_by, schema_mode, target_file_size)
        self.table = table
        if isinstance(catalog, dict):
            properties = {str(k): str(v) for k, v in catalog.items()}
            self.catalog_name = properties.pop("name", "default")
            self.catalog_properties = properties
        elif hasattr(catalog, "properties") and hasattr(catalog, "name"):
            self.catalog_name, self.catalog_properties = catalog.name, dict(catalog.properties)
        else:
            raise ConfigurationError(f"Iceberg.catalog must be a dict of catalog properties (as "
                                     f"pyiceberg.catalog.load_catalog takes them) or a catalog object, got {catalog!r}")
        self._location: str | None = None

    def _where(self) -> str:
        return f"Iceberg sink of table {self.table!r}"

    def load_catalog(self):
        """The catalog, loaded from its properties; a catalog that cannot load is named with why."""
        from pyiceberg.catalog import load_catalog

        try:
            return load_catalog(self.catalog_name, **self.catalog_properties)
        except Exception as exc:   # every loader's own error: re-raised as a configuration error
            raise ConfigurationError(f"{self._where()}: the catalog {self.catalog_name!r} "
                                     f"({_shown(self.catalog_properties)}) cannot be loaded: {exc}; check catalog=") from exc

    def _load_table(self, catalog):
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return catalog.load_table(self.table)
        except NoSuchTableError:
            return None

    # --------------------------------------------------------------- checks before the job runs
    def _check_table(self) -> None:
        table = self._load_table(self.load_catalog())
        if table is not None:
            self._check_existing(table)

    def _check_existing(self, table) -> None:
        schema = table.schema()
        names = {field.field_id: field.name for field in schema.fields}
        partitions = []
        for field in table.spec().fields:
            if type(field.transform).__name__ != "IdentityTransform":
                raise ConfigurationError(f"{self._where()}: the table's partition field {field.name!r} uses "
                                         f"{field.transform}; this sink writes identity partitions only")
            partitions.append(names[field.source_id])
        self._adopt_partitioning(partitions)
        if self._schema is not None:
            problem = schema_problem(_iceberg_fields(self._schema), _iceberg_fields(schema.as_arrow()), self.schema_mode)
            if problem:
                raise ConfigurationError(f"{self._where()}: {problem}")
        self._location = table.location()

    def check_output(self, sink_name: str, resuming: bool) -> None:
        """At `execute()`: check the table, or create it — its location is where the writers write."""
        catalog = self.load_catalog()
        table = self._load_table(catalog)
        if table is not None:
            self._check_existing(table)
            return
        if self._schema is None:
            raise ConfigurationError(f"{self._where()}: the table does not exist and the stream's schema is not "
                                     f"known at build time to create it; declare the source's schema, or create "
                                     f"the table first")
        namespace = self.table.rsplit(".", 1)[0]
        catalog.create_namespace_if_not_exists(namespace)
        table = catalog.create_table(self.table, schema=self._schema)
        if self.partition_by:
            with table.update_spec() as spec:
                for name in self.partition_by:
                    spec.add_identity(name)
        log.info("Iceberg sink: created table %s at %s", self.table, table.location())
        self._location = table.location()

    # --------------------------------------------------------------- runtime parts
    def create_writer(self, ctx: OperatorContext) -> SinkWriter:
        if self._location is None:
            raise ConfigurationError(f"{self._where()}: the table's location is unknown (execute() resolves it)")
        return LakeWriter(ctx, filesystem.join(self._location, "data"), self.partition_by, to_table_types,
                          self.target_file_size, partition_columns_in_files=True)

    def create_driver_component(self) -> GlobalCommitter:
        return GlobalCommitter(f"Iceberg({self.table})", lambda uid: IcebergCommitter(self, uid))


def _shown(properties: dict) -> str:
    """Catalog properties for an error message, secrets left out."""
    return ", ".join(f"{k}={'***' if any(s in k.lower() for s in ('secret', 'token', 'password', 'credential', 'key')) else v}"
                     for k, v in sorted(properties.items()))


def _iceberg_fields(schema: pa.Schema) -> dict[str, str]:
    """name -> Iceberg type of an Arrow schema (how the table stores each column)."""
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow
    from pyiceberg.schema import Schema

    converted = visit_pyarrow(schema, _ConvertToIcebergWithoutIDs(downcast_ns_timestamp_to_us=True))
    assert isinstance(converted, Schema)   # an Arrow schema converts to a Schema
    return {f.name: str(f.field_type) for f in converted.fields}


class IcebergCommitter(TableCommitter):
    def __init__(self, sink: Iceberg, uid: str):
        self._sink = sink
        self._prefix = file_prefix(uid)
        self._catalog = None

    def _table(self):
        if self._catalog is None:
            self._catalog = self._sink.load_catalog()
        return self._catalog.load_table(self._sink.table)

    def committed_versions(self, apps: set[str]) -> dict[str, int | None]:
        """Each app's value in the newest snapshot summary that has it (Flink's max-committed-checkpoint-id)."""
        table = self._table()
        versions: dict[str, int | None] = {app: None for app in apps}
        for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0, reverse=True):
            summary = snapshot.summary
            for app in [a for a, v in versions.items() if v is None]:
                value = summary.get(SUMMARY_PREFIX + app) if summary is not None else None
                if value is not None:
                    versions[app] = int(value)
            if all(v is not None for v in versions.values()):
                break
        return versions

    def commit(self, commit: Commit) -> None:
        table = self._table()
        schema = widest_schema(commit.files)
        properties = {SUMMARY_PREFIX + app: str(version) for app, version in commit.transactions.items()}
        properties["streamsnap.checkpoint"] = str(commit.checkpoint_id)
        paths = [filesystem.join(filesystem.join(table.location(), "data"), f["path"]) for f in commit.files]
        with table.transaction() as tx:
            problem = schema_problem(_iceberg_fields(schema), _iceberg_fields(table.schema().as_arrow()),
                                     self._sink.schema_mode)
            if problem:
                raise ConfigurationError(f"Iceberg sink of table {self._sink.table!r}: {problem}")
            if set(schema.names) - set(table.schema().column_names):
                with tx.update_schema() as update:
                    update.union_by_name(schema)
            tx.add_files(paths, snapshot_properties=properties, check_duplicate_files=False)

    def cleanup(self, keep: set[str], current_token: str) -> list[str]:
        table = self._table()
        referenced = {posixpath.basename(p) for p in [*(t.file.file_path for t in table.scan().plan_files()), *keep]}
        return delete_unreferenced(filesystem.join(table.location(), "data"), self._prefix, referenced, current_token)

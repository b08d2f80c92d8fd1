"""`ss.sinks.Delta`: a Delta Lake table written exactly-once, one commit per completed checkpoint.

Writers (one per subtask) write Parquet data files under the table as the stream flows
(`data_files.py`); the sink's global committer on the JobMaster (`committer.py`) adds a
checkpoint's files in one Delta commit that carries the application transaction
`txn(appId=streamsnap-<job>-<sink uid>-<run>, version=<checkpoint id>)` — the Delta protocol's
own idempotence marker (Spark Structured Streaming's `txnAppId`/`txnVersion`), so a commit
repeated after a failover is recognised in the table's log and skipped.

The table is checked before the job runs (`validate` at `sink_to`, again at `execute`): a path
that is something else (a file, Parquet files, an Iceberg table), a stream column the table
lacks (schema_mode="error") or one whose type differs, a partitioning that disagrees with the
table's, and a type Delta cannot store are named with the fix. Types are stored faithfully:
timestamps as Delta `timestamp` (UTC instants, microseconds; a zone-less one as `timestamp_ntz`),
decimals with their precision and scale, structs, lists and maps nested; unsigned integers
widen to the next signed type (uint64, which none holds, is refused).
"""

from __future__ import annotations

import json
import logging
import posixpath
import time

import pyarrow as pa

from streamsnap.checkpoint import filesystem
from streamsnap.connectors.base import SinkWriter
from streamsnap.connectors.files import existing_directory, visible_names
from streamsnap.connectors.lakehouse.committer import Commit, GlobalCommitter, TableCommitter
from streamsnap.connectors.lakehouse.data_files import TARGET_FILE_SIZE, delete_unreferenced, file_prefix, widest_schema
from streamsnap.connectors.lakehouse.table_sink import TableSink, schema_problem, to_table_types
from streamsnap.connectors.lakehouse.writer import LakeWriter
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.operators.base import OperatorContext

log = logging.getLogger(__name__)


def _delta_fields(schema) -> dict[str, str]:
    """name -> Delta type (JSON) of a pa.Schema or a deltalake Schema."""
    from deltalake import Schema

    if isinstance(schema, pa.Schema):
        schema = Schema.from_arrow(schema)
    return {f.name: json.dumps(json.loads(f.to_json())["type"], sort_keys=True) for f in schema.fields}


# ===================================================================== the sink
class Delta(TableSink):
    """Writes the stream into a Delta Lake table at `path` (local path or object-store URL),
    exactly-once with checkpoints: one Delta commit per completed checkpoint.

    partition_by: partition columns (a new table's; an existing table's must agree, None adopts them).
    storage_options: delta-rs's object-store options (credentials, endpoints).
    schema_mode: "error" (default) refuses stream columns the table lacks, naming them; "merge"
      adds them to the table (nullable) — also when a widening stream grows while the job runs.
    target_file_size: bytes after which a data file rolls (it also closes at every checkpoint).
    """

    def __init__(self, path: str, partition_by: list[str] | str | None = None, *,
                 storage_options: dict[str, str] | None = None, schema_mode: str = "error",
                 target_file_size: int = TARGET_FILE_SIZE):
        _require_deltalake()
        if not isinstance(path, str) or not path:
            raise ConfigurationError(f"Delta.path must be a table path or URL, got {path!r}")
        super().__init__(partition_by, schema_mode, target_file_size)
        self.path = filesystem.normalize(path)
        self.storage_options = dict(storage_options or {})

    @property
    def table_uri(self) -> str:
        """The table's location as delta-rs takes it: a plain path for local tables, else the URL."""
        return filesystem.user_path(self.path)

    def _where(self) -> str:
        return f"Delta sink at {self.table_uri!r}"

    # --------------------------------------------------------------- checks before the job runs
    def _check_table(self) -> None:
        from deltalake import DeltaTable

        directory = existing_directory(self.path, self._where(), "choose a directory (new or a Delta table)")
        if directory is None:
            return
        fs, root = directory
        if not DeltaTable.is_deltatable(self.table_uri, self.storage_options):
            other = _other_format(fs, root)
            if other:
                raise ConfigurationError(f"{self._where()}: the directory is not a Delta table (no _delta_log) but "
                                         f"holds {other}; write to a new path, or convert it first "
                                         f"(deltalake.convert_to_deltalake for Parquet)")
            return
        table = DeltaTable(self.table_uri, storage_options=self.storage_options)
        self._adopt_partitioning(list(table.metadata().partition_columns))
        if self._schema is not None:
            problem = schema_problem(_delta_fields(self._schema), _delta_fields(table.schema()), self.schema_mode)
            if problem:
                raise ConfigurationError(f"{self._where()}: {problem}")

    # --------------------------------------------------------------- runtime parts
    def create_writer(self, ctx: OperatorContext) -> SinkWriter:
        return LakeWriter(ctx, self.path, self.partition_by, to_table_types, self.target_file_size)

    def create_driver_component(self) -> GlobalCommitter:
        return GlobalCommitter(f"Delta({self.table_uri})", lambda uid: DeltaCommitter(self, uid))


def _other_format(fs, root: str) -> str | None:
    entries = [posixpath.basename(e.rstrip("/")) for e in fs.ls(root, detail=False)]
    if "metadata" in entries and any(p.endswith(".metadata.json") for p in fs.ls(posixpath.join(root, "metadata"),
                                                                                detail=False)):
        return "an Apache Iceberg table (metadata/*.metadata.json)"
    visible = visible_names(entries)
    if not visible:
        return None
    parquet = [e for e in visible if e.endswith(".parquet")]
    if parquet:
        return f"{len(parquet)} Parquet file(s) ({', '.join(sorted(parquet)[:2])}, ...)"
    return f"{len(visible)} other entries ({', '.join(sorted(visible)[:3])})"


def _require_deltalake() -> None:
    try:
        import deltalake  # noqa: F401
    except ImportError:
        raise ConfigurationError("ss.sinks.Delta needs the deltalake package: pip install 'streamsnap[lakehouse]'") from None


# ===================================================================== committer (the JobMaster)
class DeltaCommitter(TableCommitter):
    def __init__(self, sink: Delta, uid: str):
        self._sink = sink
        self._prefix = file_prefix(uid)

    def _table(self):
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self._sink.table_uri, self._sink.storage_options):
            return None
        return DeltaTable(self._sink.table_uri, storage_options=self._sink.storage_options)

    def committed_versions(self, apps: set[str]) -> dict[str, int | None]:
        table = self._table()
        return {app: (table.transaction_version(app) if table is not None else None) for app in apps}

    def commit(self, commit: Commit) -> None:
        from deltalake import Schema
        from deltalake.transaction import AddAction, CommitProperties, Transaction, create_table_with_add_actions

        sink = self._sink
        schema = widest_schema(commit.files)
        now = int(time.time() * 1000)
        actions = [AddAction(f["path"], f["size"], dict(zip(sink.partition_by, f["partition"])), now, True,
                             _delta_stats(f["stats"])) for f in commit.files]
        properties = CommitProperties(
            custom_metadata={"streamsnap.checkpoint": commit.checkpoint_id},
            app_transactions=[Transaction(app, version) for app, version in sorted(commit.transactions.items())])
        table = self._table()
        if table is None:
            create_table_with_add_actions(sink.table_uri, Schema.from_arrow(schema), actions, mode="append",
                                          partition_by=sink.partition_by or None,
                                          storage_options=sink.storage_options or None, commit_properties=properties)
            return
        self._evolve(table, schema)
        table.create_write_transaction(actions, "append", table.schema(), partition_by=sink.partition_by or None,
                                       commit_properties=properties)

    def _evolve(self, table, schema: pa.Schema) -> None:
        """Stream columns the table lacks: added (schema_mode="merge") or refused, naming them."""
        from deltalake import Field, Schema

        fields = _delta_fields(table.schema())
        problem = schema_problem(_delta_fields(schema), fields, self._sink.schema_mode)
        if problem:
            raise ConfigurationError(f"Delta sink at {self._sink.table_uri!r}: {problem}")
        new = [f for f in Schema.from_arrow(schema).fields if f.name not in fields]
        if new:
            log.info("Delta sink at %s: schema_mode='merge' adds column(s) %s", self._sink.table_uri,
                     ", ".join(f.name for f in new))
            table.alter.add_columns([Field(f.name, f.type, nullable=True) for f in new])

    def cleanup(self, keep: set[str], current_token: str) -> list[str]:
        table = self._table()
        referenced = {posixpath.basename(p) for p in [*(table.file_uris() if table is not None else []), *keep]}
        return delete_unreferenced(self._sink.path, self._prefix, referenced, current_token)


def _delta_stats(stats: dict) -> str:
    return json.dumps({"numRecords": stats["rows"], "minValues": stats["min"], "maxValues": stats["max"],
                       "nullCount": stats["nulls"]})

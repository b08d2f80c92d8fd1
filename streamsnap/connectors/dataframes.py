"""DataFrames and Arrow tables as bounded, replayable sources (`env.from_dataframe` / `from_arrow`).

Why files: a Spark DataFrame is a plan on the driver's JVM; a streamsnap subtask is a Python
process inside a Spark task, which can neither hold nor re-run that plan, and a plan re-run after
a failure may not return the same rows in the same order (exactly-once replay needs exactly the
same rows). So the data is *materialized once* when the job is executed — written as Parquet
by Spark itself (`df.write.parquet`, one file per DataFrame partition) or, for an Arrow table,
by the driver (one file per range of record batches) — into the job's checkpoint storage:

    <checkpoint dir>/<job id>/inputs/<source name>-<unique>/part-*.parquet

That directory is on the storage every Spark task already reaches (a shared filesystem or an
object store on a cluster). From there on the source *is* the bounded file source
(`connectors/files.py`): every file is a split, splits are dealt round robin to the subtasks,
and a split's state is `[path, rows already emitted]`, so a restore — after a SIGKILL, or from a
savepoint at another parallelism — resumes every file exactly where the checkpoint left it.
The restored positions name their files by path, so a restore reads the very copy the
checkpoint was taken over, even if the DataFrame would now return other rows; a run that
restores the source's state (`restore_from=`, or a new driver resuming the job) writes nothing,
a new (non-restored) run materializes a new copy. The copies stay with the job's directory (delete
it, or its `inputs/`, when no checkpoint or savepoint of the job is needed any more).

Without checkpointing there is no job storage: the copy goes to `staging_dir` if given, else a
local temporary directory (fine for `local[N]`; on a cluster pass a shared `staging_dir`).
"""

from __future__ import annotations

import logging
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

from streamsnap.checkpoint import filesystem
from streamsnap.connectors.files import FileSource
from streamsnap.errors import ConfigurationError
from streamsnap.state.snapshot import safe_file_prefix

log = logging.getLogger(__name__)

INPUTS_DIR = "inputs"
_NOT_MATERIALIZED = "streamsnap-dataframe-not-materialized-yet"


def spark_schema_to_arrow(schema, what: str) -> pa.Schema:
    """The Arrow schema of a Spark StructType, or ConfigurationError naming the column type."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{what}: the DataFrame has a column type Arrow cannot hold ({exc}); cast or drop "
            f"that column (df.withColumn(...).cast(...)) first") from exc


class DataFrameSource(FileSource):
    """A Spark DataFrame or a pyarrow Table, materialized as Parquet when the job executes.

    data: a (batch, not streaming) pyspark DataFrame, or a pyarrow Table / RecordBatch.
    splits: Arrow tables only — how many files (ranges of rows, cut at record-batch
      boundaries when possible) to write; default: the source's parallelism.
    staging_dir: where to write the copy when the job has no checkpoint storage.
    """

    def __init__(self, data, *, name: str = "dataframe", batch_size: int = 4096,
                 splits: int | None = None, staging_dir: str | None = None):
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        if isinstance(data, pa.Table):
            schema = data.schema
        elif hasattr(data, "sparkSession") and hasattr(data, "isStreaming"):
            if data.isStreaming:
                raise ConfigurationError(
                    f"from_dataframe '{name}': the DataFrame is a streaming one (readStream); "
                    f"from_dataframe reads a bounded DataFrame. Read the stream's files with "
                    f"env.read_files(dir, monitor_interval=...) instead")
            schema = spark_schema_to_arrow(data.schema, f"from_dataframe '{name}'")
        else:
            raise ConfigurationError(
                f"from_dataframe/from_arrow '{name}' takes a pyspark DataFrame or a pyarrow "
                f"Table, got {type(data).__name__}")
        if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
            raise ConfigurationError(f"from_arrow '{name}': splits must be an integer >= 1, got {splits!r}")
        if staging_dir is not None and (not isinstance(staging_dir, str) or not staging_dir.strip()):
            raise ConfigurationError(
                f"from_dataframe '{name}': staging_dir must be a directory path or URL, got {staging_dir!r}")
        super().__init__(_NOT_MATERIALIZED, "parquet", schema=schema, batch_size=batch_size)
        self.name = name
        self.num_splits = splits
        self.staging_dir = staging_dir
        self.parallelism = 1
        self._data = data
        self._materialized = False

    # ------------------------------------------------------------ build time (driver)
    def validate(self) -> None:
        """Nothing to list yet: the files are written at execute() (`prepare`)."""

    def prepare(self, job_directory: str | None, restored: bool) -> None:
        """Write the data once into `<job directory>/inputs/` (or the staging directory) — not
        when the run restores this source: its splits name the copy the checkpoint was taken over."""
        if restored:
            log.info("from_dataframe '%s': restored, reading the copy its checkpointed splits name", self.name)
            return
        if self._data is None:
            raise ConfigurationError(
                f"from_dataframe '{self.name}': this source was unpickled without its data; "
                f"build the pipeline again on the driver")
        if job_directory is not None:
            parent = filesystem.join(job_directory, INPUTS_DIR)
        elif self.staging_dir is not None:
            parent = filesystem.normalize(self.staging_dir.strip())
        else:
            parent = filesystem.normalize(tempfile.mkdtemp(prefix="streamsnap-inputs-"))
        target = filesystem.join(parent, filesystem.unique_name(safe_file_prefix(self.name)))
        if isinstance(self._data, pa.Table):
            self._write_arrow(target)
        else:
            self._write_spark(target)
        self.path = target
        self._files = None
        self._materialized = True
        self._files = self._list()
        log.info("from_dataframe '%s': %d file(s) under %s", self.name, len(self._files),
                 filesystem.user_path(target))

    def _write_spark(self, target: str) -> None:
        try:
            self._data.write.mode("errorifexists").parquet(target)
        except Exception as exc:
            raise ConfigurationError(
                f"from_dataframe '{self.name}': writing the DataFrame to {target} failed: "
                f"{type(exc).__name__}: {str(exc)[:500]}") from exc

    def _write_arrow(self, target: str) -> None:
        table: pa.Table = self._data
        count = max(1, min(self.num_splits or self.parallelism, table.num_rows or 1))
        filesystem.makedirs(target)
        fs, directory = filesystem.filesystem(target)
        per_file = -(-table.num_rows // count)
        for index in range(count):
            part = table.slice(index * per_file, per_file)
            with fs.open(f"{directory}/part-{index:05d}.parquet", "wb") as out:
                pq.write_table(part, out)

    def splits(self, parallelism: int) -> list:
        if not self._materialized:
            raise ConfigurationError(
                f"from_dataframe '{self.name}': the data was not materialized; it is written when "
                f"the job runs (env.execute / execute_async)")
        return super().splits(parallelism)

    def __getstate__(self) -> dict:
        # The DataFrame lives in the driver's JVM and the table may be large: tasks read the files.
        state = dict(self.__dict__)
        state["_data"] = None
        return state

    def __repr__(self) -> str:
        where = self.path if self._materialized else "not materialized yet"
        return f"DataFrameSource({self.name!r}, {where})"

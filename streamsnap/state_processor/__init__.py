"""State Processor: a checkpoint's or savepoint's state as Spark DataFrames, and savepoints
written from DataFrames (Flink's State Processor API, Spark's `statestore` source).

    ss.state.read(spark, path, uid, state_name)     # DataFrame of (key, value) / (key, map_key, value)
    ss.state.metadata(spark, path)                  # operators, states, parallelism, sizes
    ss.state.bootstrap(df, "key", uid=..., state_name=..., path=..., value_column=...)
    ss.state.SavepointWriter().keyed_state(...).operator_state(...).write(path)   # several states

`reader.py` reads with one Spark job planned on the driver (`plan.py`) that decodes in its tasks
(`scan.py`, `tables.py`);
`bootstrap.py` writes canonical keyed state files from Spark tasks, operator state files on the
driver, and `_metadata` last.
"""

from streamsnap.state_processor.bootstrap import SavepointWriter, bootstrap
from streamsnap.state_processor.reader import metadata, read

__all__ = ["SavepointWriter", "bootstrap", "metadata", "read"]

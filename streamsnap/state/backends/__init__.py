"""Keyed state backends.

`hashmap`: state on the Python heap with copy-on-write snapshots. `rocksdb`: state in an
embedded RocksDB per subtask (the `rocksdict` package, imported only when a RocksDB backend is
created). Both write the same canonical snapshot format, so a job can switch backends through
a checkpoint or savepoint.
"""

from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend, KeyedStateSnapshot
from streamsnap.state.backends.rocksdb import (RocksDBConfig, RocksDBKeyedStateBackend,
                                               RocksDBKeyedStateSnapshot)

__all__ = ["HashMapKeyedStateBackend", "KeyedStateSnapshot", "RocksDBConfig",
           "RocksDBKeyedStateBackend", "RocksDBKeyedStateSnapshot"]

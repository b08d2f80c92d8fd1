"""Keyed state backends.

`hashmap`: state on the Python heap with copy-on-write snapshots. `rocksdb`: state in an
embedded RocksDB per subtask (the `rocksdict` package, imported only when a RocksDB backend is
created). Both write the same canonical format for savepoints (and for full checkpoints), so a
job can switch backends through a savepoint; RocksDB's incremental checkpoints
(`rocksdb.incremental`) are restored by the RocksDB backend only.
"""

from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend, KeyedStateSnapshot
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.backends.rocksdb.snapshot import RocksDBKeyedStateSnapshot

__all__ = ["HashMapKeyedStateBackend", "KeyedStateSnapshot", "RocksDBConfig",
           "RocksDBKeyedStateBackend", "RocksDBKeyedStateSnapshot"]

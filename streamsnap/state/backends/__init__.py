"""Keyed state backends. `hashmap`: state on the Python heap with copy-on-write snapshots."""

from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend, KeyedStateSnapshot

__all__ = ["HashMapKeyedStateBackend", "KeyedStateSnapshot"]

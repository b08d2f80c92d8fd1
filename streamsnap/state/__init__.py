"""`ss.state`: state a job's functions declare, and the State Processor API.

Keyed state (`ValueState`, `ListState`, `MapState`, `ReducingState`, declared with their
descriptors and optional `StateTtlConfig`) is scoped to the current key; operator state
(`OperatorListState`, `BroadcastState`) to a subtask. `read`, `metadata`, `bootstrap` and
`SavepointWriter` read a checkpoint's or savepoint's state as Spark DataFrames and write
savepoints from DataFrames (they need Spark and are imported on first use):

    df = ss.state.read(spark, "/tmp/savepoints/savepoint-clicks-1a2b3c4d-3-...", uid="counts")

How state is kept, snapshotted and redistributed is in the docs' Architecture section.
"""

from streamsnap.state.assignment import (OperatorStateRestore, StateElementRef,
                                         SubtaskRestoreState, assign_operator_state)
from streamsnap.state.backends.hashmap import HashMapKeyedStateBackend, KeyedStateSnapshot
from streamsnap.state.descriptors import (ListStateDescriptor, MapStateDescriptor,
                                          ReducingStateDescriptor, StateDescriptor,
                                          ValueStateDescriptor)
from streamsnap.state.errors import StateError, StateSerializationError
from streamsnap.state.key_groups import (KeyGroupRange, assign_key_groups, assign_to_key_group,
                                         default_max_parallelism, hash_key, hash_keys,
                                         hash_keys_columns, key_group_range_for_subtask,
                                         subtask_for_key_group, subtasks_for_key_groups)
from streamsnap.state.keyed_state import (KeyedState, ListState, MapState, ReducingState,
                                          ValueState)
from streamsnap.state.operator_state import (BroadcastState, OperatorListState,
                                             OperatorStateBackend, OperatorStateSnapshot)
from streamsnap.state.serialization import MsgpackSerializer, PickleSerializer, Serializer
from streamsnap.state.snapshot import SnapshotDiscardedError, StateSnapshot
from streamsnap.state.ttl import StateTtlConfig, TtlStateVisibility, TtlUpdateType

# The public names: what a job's functions declare and use, and the State Processor API
# (`read`, `metadata`, `bootstrap`, `SavepointWriter`, imported on first use). The other names
# imported above (backends, key groups, snapshots, restore plans) are the runtime's: importable
# from here for its own code and tests, but not part of the API and not listed by dir().
__all__ = [
    "ValueStateDescriptor", "ListStateDescriptor", "MapStateDescriptor", "ReducingStateDescriptor",
    "StateDescriptor", "ValueState", "ListState", "MapState", "ReducingState", "KeyedState",
    "OperatorListState", "BroadcastState", "StateTtlConfig", "TtlStateVisibility", "TtlUpdateType",
    "Serializer", "MsgpackSerializer", "PickleSerializer", "StateError", "StateSerializationError",
    "read", "metadata", "bootstrap", "SavepointWriter",
]


_STATE_PROCESSOR = ("read", "metadata", "bootstrap", "SavepointWriter")


def __getattr__(name: str):
    """`ss.state.read / metadata / bootstrap / SavepointWriter` (streamsnap.state_processor), imported on first use:
    they need Spark, which the task-side state code never does."""
    if name in _STATE_PROCESSOR:
        import streamsnap.state_processor as state_processor

        return getattr(state_processor, name)
    raise AttributeError(f"module 'streamsnap.state' has no attribute {name!r}")


def __dir__() -> list[str]:
    """`dir()` lists the public names (`__all__`), state_processor's included, not the internals."""
    return sorted(__all__)

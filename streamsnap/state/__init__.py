"""State: keyed state (by key group) and operator state, their backends, and redistribution.

See ARCHITECTURE.md: keyed state (Value/List/Map/Reducing) scoped to the current key, key groups
as the unit of rescaling, operator list state dealt out by element, and asynchronous
copy-on-write snapshots written to checkpoint storage.
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

__all__ = [
    "BroadcastState", "HashMapKeyedStateBackend", "KeyGroupRange", "KeyedState",
    "KeyedStateSnapshot", "ListState", "ListStateDescriptor", "MapState", "MapStateDescriptor",
    "MsgpackSerializer", "OperatorListState", "OperatorStateBackend", "OperatorStateRestore",
    "OperatorStateSnapshot", "PickleSerializer", "ReducingState", "ReducingStateDescriptor",
    "Serializer", "SnapshotDiscardedError", "StateDescriptor", "StateElementRef", "StateError",
    "StateSerializationError", "StateSnapshot", "StateTtlConfig", "TtlStateVisibility",
    "TtlUpdateType", "SubtaskRestoreState", "ValueState",
    "ValueStateDescriptor", "assign_key_groups", "assign_operator_state", "assign_to_key_group",
    "default_max_parallelism", "hash_key", "hash_keys", "hash_keys_columns",
    "key_group_range_for_subtask", "subtask_for_key_group", "subtasks_for_key_groups",
]


_STATE_PROCESSOR = ("read", "metadata", "bootstrap", "SavepointWriter")


def __getattr__(name: str):
    """`ss.state.read / metadata / bootstrap / SavepointWriter` (streamsnap.state_processor), imported on first use:
    they need Spark, which the task-side state code never does."""
    if name in _STATE_PROCESSOR:
        import streamsnap.state_processor as state_processor

        return getattr(state_processor, name)
    raise AttributeError(f"module 'streamsnap.state' has no attribute {name!r}")

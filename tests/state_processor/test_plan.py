"""Planning a state read on the driver (state_processor/plan.py), on real snapshot files of both
backends: the states a file holds come from `_metadata`, the types from a bounded sample, and bad
input fails here, before any Spark job."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.handles import OperatorSubtaskState
from streamsnap.checkpoint.metadata import CheckpointMetadata, OperatorState
from streamsnap.errors import ConfigurationError, RestoreError
from streamsnap.runtime.events import CheckpointType
from streamsnap.state import KeyGroupRange, ListStateDescriptor, ValueStateDescriptor
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from streamsnap.state.key_groups import assign_to_key_group
from streamsnap.state_processor import plan
from tests.state.conftest import make_backend

MAX_P = 128
FULL = KeyGroupRange(0, MAX_P - 1)


def snapshot(kind: str, tmp_path, values: dict, rare: tuple | None = None) -> tuple[CheckpointMetadata, str]:
    """A one-subtask checkpoint of operator "op": value state "v" = `values`, list state "l",
    and value state "rare" holding only the entry `rare` (key, value)."""
    location = "file://" + str(tmp_path / "chk-1")
    config = RocksDBConfig(local_dir=str(tmp_path / "db"), incremental=False) if kind == "rocksdb" else None
    backend = make_backend(kind, MAX_P, FULL, "op", config)
    v, lst = backend.get_state(ValueStateDescriptor("v")), backend.get_state(ListStateDescriptor("l"))
    for key, value in values.items():
        backend.set_current_key(key, assign_to_key_group(key, MAX_P))
        v.update(value)
        lst.add("x" * 50)
    if rare is not None:
        backend.set_current_key(rare[0], assign_to_key_group(rare[0], MAX_P))
        backend.get_state(ValueStateDescriptor("rare")).update(rare[1])
    handle = backend.snapshot(1, location).run()
    backend.dispose()
    operator = OperatorState("op", 1, MAX_P, {0: OperatorSubtaskState(keyed=(handle,))})
    return CheckpointMetadata("job", 1, CheckpointType.CHECKPOINT, 0.0, 0.0, {"op": operator}), location


def plan_read(metadata, location, state, **given):
    return plan.plan_keyed_read(metadata, location, "op", state, "chk-1", {"offsets": "split"}, None, given)


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_the_plan_knows_the_states_and_types_without_spark(kind, tmp_path):
    metadata, location = snapshot(kind, tmp_path, {k: k * 10 for k in range(500)})
    read = plan_read(metadata, location, "v")
    assert read.schema == pa.schema([("key", pa.int64()), ("value", pa.int64())])
    assert plan_read(metadata, location, "l").schema.field("value").type == pa.list_(pa.string())
    with pytest.raises(ConfigurationError, match="no state named 'w'; its keyed states: 'l', 'v'; "
                                                 "its operator states: 'offsets'"):
        plan_read(metadata, location, "w")
    with pytest.raises(ConfigurationError, match="'value' column does not fit string.*pass value_type="):
        plan_read(metadata, location, "v", value=pa.string())


def test_the_sample_is_bounded_and_reads_on_only_while_the_state_is_not_found(tmp_path, monkeypatch):
    values = {k: (k if k % 2 else float(k)) for k in range(3000)}     # ints and floats mixed
    far = next(k for k in range(10_000, 20_000) if assign_to_key_group(k, MAX_P) == MAX_P - 1)
    metadata, location = snapshot("hashmap", tmp_path, values, rare=(far, "found"))
    size = metadata.operators["op"].subtask_states[0].keyed[0].size
    monkeypatch.setattr(plan, "SAMPLE_BYTES", 4096)
    reads = []
    real = filesystem.read_range
    monkeypatch.setattr(filesystem, "read_range", lambda url, off, n: reads.append(n) or real(url, off, n))
    assert plan_read(metadata, location, "v").schema.field("value").type == pa.float64()
    assert sum(reads) < size / 10
    reads.clear()
    assert plan_read(metadata, location, "rare").schema.field("value").type == pa.string()
    assert sum(reads) > size / 2          # only in the last key group: the sample read on to find it


def test_a_file_that_is_missing_or_of_another_size_is_named(tmp_path):
    metadata, location = snapshot("hashmap", tmp_path, {k: k for k in range(50)})
    name = metadata.operators["op"].subtask_states[0].keyed[0].file.path
    path = tmp_path / "chk-1" / name
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(RestoreError, match=f"chk-1 is damaged: the keyed state file .*{name} of operator "
                                           f"'op', subtask 0 has .* bytes, _metadata recorded"):
        plan_read(metadata, location, "v")
    path.unlink()
    with pytest.raises(RestoreError, match=f"{name} of operator 'op', subtask 0 is missing"):
        plan_read(metadata, location, "v")

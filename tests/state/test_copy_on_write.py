"""The heap backend's copy-on-write (`streamsnap.state.copy_on_write`): whatever the mailbox
thread writes after a snapshot's synchronous part — before the snapshot froze a key group,
while it freezes them, while it writes the file — never reaches that snapshot, with several
snapshots running at once, some of them discarded (subsumed)."""

import copy
import random
import tempfile
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.state import HashMapKeyedStateBackend, KeyGroupRange, assign_to_key_group
from streamsnap.state.backends import hashmap
from streamsnap.state.keyed_state import StateTable

from .test_hashmap_backend import (FULL, KEYS, MAX_P, Model, _keys, _values, apply_op, fill, restored,
                                   use_key)

OPERATIONS = ["set", "clear_value", "add", "clear_list", "put", "remove", "mutate"]


def new_backend(kg_range=FULL):
    return HashMapKeyedStateBackend("op", MAX_P, kg_range)


def scramble(model: Model, keys, tag) -> None:
    """Updates, in-place list/map changes, deletions and new keys, in every state."""
    for k in keys:
        use_key(model.backend, k)
        model.value.update([tag, k])
        model.list.add(tag)
        model.map.put("a", tag)
        model.reduce.add(5)
        if hash(k) % 3 == 0:
            model.list.clear()
            model.value.clear()
            model.map.remove("a")
    for i in range(40):
        use_key(model.backend, (tag, i))          # new keys, appended to key groups
        model.value.update(i)
        model.map.put("n", [i])


def snapshot_back(model: Model, handle, location) -> dict:
    return {} if handle is None else restored(lambda r: new_backend(r), [handle], location).dump()


def no_pending(backend) -> bool:
    return all(not t.pending for t in backend._tables.values()) and backend._required_epoch == -1


def test_writes_after_the_async_part_froze_everything_stay_out(location, monkeypatch):
    """Writes while the file is being written (every key group already frozen)."""
    model = Model(new_backend())
    fill(model, KEYS)
    expected = copy.deepcopy(model.dump())
    snapshot = model.backend.snapshot(1, location)
    written = hashmap._CoalescedWriter.write
    calls = []

    def write_and_scramble(self, data):
        if not calls:
            scramble(model, KEYS, "during-write")
        calls.append(len(data))
        return written(self, data)

    monkeypatch.setattr(hashmap._CoalescedWriter, "write", write_and_scramble)
    handle = snapshot.run()
    assert calls
    assert snapshot_back(model, handle, location) == expected
    assert no_pending(model.backend)


def test_writes_between_freezes_stay_out(location, monkeypatch):
    """Writes after the snapshot froze some key groups and before it froze the others: the
    writes freeze the rest themselves."""
    model = Model(new_backend())
    fill(model, KEYS)
    expected = copy.deepcopy(model.dump())
    snapshot = model.backend.snapshot(1, location)
    frozen = StateTable.frozen
    seen = []

    def freeze_and_scramble(self, key_group, capture):
        group = frozen(self, key_group, capture)
        seen.append(key_group)
        if len(seen) == 3:
            scramble(model, KEYS, "mid-freeze")
        return group

    monkeypatch.setattr(StateTable, "frozen", freeze_and_scramble)
    handle = snapshot.run()
    assert len(seen) > 3
    assert snapshot_back(model, handle, location) == expected


def test_a_delete_before_the_freeze_is_undone_in_the_snapshot_only(location):
    model = Model(new_backend())
    fill(model, KEYS)
    expected = copy.deepcopy(model.dump())
    snapshot = model.backend.snapshot(1, location)
    for k in KEYS:                                   # every key group: deleted before its freeze
        use_key(model.backend, k)
        model.value.clear()
        model.list.clear()
        model.map.remove("a")
        model.map.remove(("t", 1))
        model.reduce.clear()
    assert model.backend.num_keys() == 0
    assert snapshot_back(model, snapshot.run(), location) == expected


def test_many_overlapping_snapshots_some_subsumed(tmp_path):
    """Snapshots taken back to back (some share a key group's capture: nothing was written
    there in between), discarded ones among them, run out of order on other threads while the
    mailbox thread keeps writing: each holds the state of its own synchronous part."""
    model = Model(new_backend())
    rng = random.Random(7)
    keys = list(range(3000))
    fill(model, keys)
    taken = []
    for checkpoint_id in range(1, 9):
        touched = rng.sample(keys, 40)               # only a few key groups change in between
        scramble(model, touched, f"before-{checkpoint_id}")
        location = "file://" + str(tmp_path / f"chk-{checkpoint_id}")
        (tmp_path / f"chk-{checkpoint_id}").mkdir()
        expected = copy.deepcopy(model.dump())
        taken.append((model.backend.snapshot(checkpoint_id, location), location, expected))
    shared = set.intersection(*({id(c) for _, c in s._parts[0].key_groups} for s, _, _ in taken[-2:]))
    assert shared                                    # untouched key groups: one capture for both
    for snapshot, _, _ in taken[1::3]:               # subsumed before they ran
        snapshot.discard()
    survivors = [t for t in taken if t[0].status != "discarded"]
    results = {}

    def run(snapshot):
        results[snapshot.checkpoint_id] = snapshot.run()

    threads = [threading.Thread(target=run, args=(s,)) for s, _, _ in reversed(survivors)]
    for thread in threads:
        thread.start()
    rounds = 0
    while any(t.is_alive() for t in threads) or rounds < 3:
        scramble(model, rng.sample(keys, 200), f"after-{rounds}")
        rounds += 1
    for thread in threads:
        thread.join()
    for snapshot, location, expected in survivors:
        assert snapshot_back(model, results[snapshot.checkpoint_id], location) == expected
    assert no_pending(model.backend)


def test_a_discarded_snapshot_stops_freezing_and_frees_its_captures(location):
    model = Model(new_backend())
    fill(model, KEYS)
    first = model.backend.snapshot(1, location)
    second = model.backend.snapshot(2, location)     # joins the same pending captures
    table = model.backend._tables["value"]
    assert all(c.holders == 2 for c in table.pending.values())
    first.discard()
    assert table.pending and all(c.holders == 1 for c in table.pending.values())
    second.discard()
    assert no_pending(model.backend)
    use_key(model.backend, KEYS[0])
    model.value.update(123)                          # nothing left to freeze
    assert not table.pending


def test_one_freeze_serves_every_snapshot_that_shares_a_capture(location, tmp_path):
    model = Model(new_backend())
    fill(model, KEYS[:100])
    expected = copy.deepcopy(model.dump())
    first = model.backend.snapshot(1, location)
    second = model.backend.snapshot(2, "file://" + str(tmp_path))
    captures = dict(first._parts[0].key_groups)
    assert captures == dict(second._parts[0].key_groups)
    handle = first.run()
    assert all(c.frozen is not None for c in captures.values())
    scramble(model, KEYS[:100], "late")              # after the freeze: no effect on either
    assert snapshot_back(model, handle, location) == expected
    assert snapshot_back(model, second.run(), "file://" + str(tmp_path)) == expected


def test_only_the_value_column_is_copied_when_keys_can_be_reused(location):
    """After a first snapshot, a freeze reads the keys added since, not all of them."""
    model = Model(new_backend())
    same_group = [k for k in range(5000) if assign_to_key_group(k, MAX_P) == 9][:50]
    for k in same_group[:40]:
        use_key(model.backend, k)
        model.value.update(k)
    model.backend.snapshot(1, location).run()
    for k in same_group[40:]:
        use_key(model.backend, k)
        model.value.update(k)
    snapshot = model.backend.snapshot(2, location)
    use_key(model.backend, same_group[0])
    model.value.update(-1)                           # the write freezes key group 9
    group = next(c for kg, c in snapshot._parts[0].key_groups if kg == 9).frozen
    assert group.entries is None and group.added == same_group[40:]
    assert group.values == same_group
    back = snapshot_back(model, snapshot.run(), location)
    assert back == {("value", k): k for k in same_group}


_ops = st.lists(st.one_of(st.tuples(st.sampled_from(OPERATIONS), _keys, _values),
                          st.tuples(st.sampled_from(["snapshot", "discard", "run"]),
                                    st.just(0), st.integers(0, 9))),
                max_size=80)


@settings(max_examples=examples(80), deadline=None)
@given(_ops)
def test_any_interleaving_of_writes_snapshots_discards_and_runs(ops):
    """A model of the state at each snapshot's synchronous part against what each snapshot
    restores to, over random interleavings (several snapshots running, some discarded)."""
    model = Model(new_backend())
    reference: dict = {}
    running = []
    with tempfile.TemporaryDirectory() as directory:
        for i, (op, key, value) in enumerate(ops):
            if op == "snapshot":
                location = f"file://{directory}/chk-{i}"
                running.append((model.backend.snapshot(i, location), location,
                                copy.deepcopy(reference)))
            elif op in ("discard", "run"):
                if running:
                    snapshot, location, expected = running.pop(value % len(running))
                    if op == "discard":
                        snapshot.discard()
                    else:
                        assert snapshot_back(model, snapshot.run(), location) == expected
            else:
                apply_op(model, op, key, value, reference)
        for snapshot, location, expected in running:
            assert snapshot_back(model, snapshot.run(), location) == expected
    assert model.dump() == reference
    assert no_pending(model.backend)


@pytest.mark.parametrize("ttl", [False, True])
def test_ttl_and_pickled_states_freeze_whole_key_groups(location, ttl):
    """States whose snapshot needs the entries as a dict (TTL filtering) or a serializer
    call per value still see the captured state."""
    from streamsnap.state import PickleSerializer, StateTtlConfig, ValueStateDescriptor

    backend = new_backend()
    descriptor = ValueStateDescriptor("v", serializer=PickleSerializer(),
                                      ttl=StateTtlConfig(3600) if ttl else None)
    state = backend.get_state(descriptor)
    for k in range(200):
        use_key(backend, k)
        state.update({k})
    snapshot = backend.snapshot(1, location)
    for k in range(0, 200, 2):
        use_key(backend, k)
        state.update({-k})
        if k % 4 == 0:
            state.clear()
    back = new_backend()
    back.restore([snapshot.run()], location)
    again = back.get_state(descriptor)
    for k in range(200):
        use_key(back, k)
        assert again.value() == {k}

"""The distinct sets' lookup filter (window_distinct.DistinctSets with seen_filter.SeenFilter) on
a real RocksDB backend, against a plain-Python model of the sets, over random sequences of
batches, window clean-ups, windows created again after their clean-up, and restarts (a new
DistinctSets over the same database, as after a restore: its windows untracked). Every count of
new values must match the model; a filter answering "not seen" wrongly would count a value twice."""

from __future__ import annotations

import tempfile

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsnap.runtime.operators.seen_filter import name_hashes
from streamsnap.runtime.operators.window_distinct import DistinctSets, DistinctSpec
from streamsnap.state import KeyGroupRange, assign_to_key_group
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig
from tests.properties import examples

MAX_P = 128
SPECS = (DistinctSpec("v"), DistinctSpec("v", "p"))
NAMES = [(key, start) for key in ("a", 7) for start in (0, 10)]

rows = st.lists(st.tuples(st.sampled_from(range(len(NAMES))), st.integers(0, 12), st.booleans()),
                min_size=1, max_size=40)
operations = st.lists(st.one_of(st.tuples(st.just("batch"), rows),
                                st.tuples(st.just("clear"), st.lists(st.sampled_from(range(len(NAMES))),
                                                                    min_size=1, max_size=3)),
                                st.tuples(st.just("restart"), st.none())),
                      min_size=1, max_size=25)


@settings(max_examples=examples(150))
@given(operations)
def test_counts_of_new_values_match_the_model_through_clears_and_restarts(ops):
    with tempfile.TemporaryDirectory() as directory:
        backend = RocksDBKeyedStateBackend("op", MAX_P, KeyGroupRange(0, MAX_P - 1),
                                           RocksDBConfig(local_dir=directory, write_cache_size=4096))
        try:
            sets = DistinctSets(backend, SPECS)
            model: dict = {}                   # name -> {value: bits}, the windows that exist
            for kind, arg in ops:
                if kind == "restart":
                    sets = DistinctSets(backend, SPECS)
                elif kind == "clear":
                    gone = sorted({NAMES[i] for i in arg if NAMES[i] in model}, key=repr)
                    sets.clear(gone, [assign_to_key_group(n, MAX_P) for n in gone])
                    for name in gone:
                        del model[name]
                else:
                    in_batch = sorted({g for g, _, _ in arg})
                    position = {g: p for p, g in enumerate(in_batch)}
                    names = [NAMES[g] for g in in_batch]
                    batch = pa.RecordBatch.from_pydict({"v": [v for _, v, _ in arg], "p": [p for _, _, p in arg]})
                    fresh = np.array([n not in model for n in names])
                    new = sets.add(batch, np.arange(len(arg)), np.array([position[g] for g, _, _ in arg]),
                                   names, [assign_to_key_group(n, MAX_P) for n in names],
                                   [n[1] for n in names], fresh, name_hashes(names))
                    expected = [np.zeros(len(names), dtype=np.int64) for _ in SPECS]
                    for g, v, p in arg:
                        held = model.setdefault(NAMES[g], {})
                        bits = 1 | (2 if p else 0)
                        added = bits & ~held.get(v, 0)
                        for s, bit in enumerate((1, 2)):
                            if added & bit:
                                expected[s][position[g]] += 1
                        held[v] = held.get(v, 0) | bits
                    assert [n.tolist() for n in new] == [e.tolist() for e in expected]
        finally:
            backend.dispose()

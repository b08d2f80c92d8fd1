"""State TTL on real Spark: a KeyedProcessFunction's ValueState with a short time-to-live
forgets a key that was not written for longer than the ttl, and remembers one written within
it. The gap is made by the source itself: row 3 is held back (without blocking the source task,
which keeps sending) until the keyed task has processed rows 0-2 (a marker file) and 2 s more
have passed, against a ttl of 0.5 s — so the test has no timing assertion and does not depend
on how fast the tasks were deployed."""

from __future__ import annotations

import os
import time

import pytest

import streamsnap as ss
from streamsnap.connectors.sources import Generator, GeneratorReader

pytestmark = pytest.mark.spark

TTL = 0.5
PAUSE = 2.0
KEYS = ["a", "b", "b", "a", "a"]     # the pause comes before row 3


def event(i: int) -> dict:
    return {"key": KEYS[i], "i": i}


class _GatedReader(GeneratorReader):
    """Rows 0-2 at once; row 3 only once the marker exists and PAUSE has passed since."""

    def __init__(self, source, ctx, marker: str):
        super().__init__(source, ctx)
        self._marker, self._release_at = marker, None
        self._deadline = time.monotonic() + 60

    def poll(self):
        if self._emitted_since_start == 3:
            if self._release_at is None:
                if not os.path.exists(self._marker):
                    assert time.monotonic() < self._deadline, "the keyed task never processed rows 0-2"
                    return None
                self._release_at = time.monotonic() + PAUSE   # processing-time gap for 'a'
            if time.monotonic() < self._release_at:
                return None
        return super().poll()

    def next_available_in(self) -> float:
        return 0.01


class GatedGenerator(Generator):
    def __init__(self, marker: str):
        super().__init__(event, count=len(KEYS), batch_size=1)
        self.marker = marker

    def create_reader(self, ctx):
        return _GatedReader(self, ctx, self.marker)


class CountWithTtl(ss.KeyedProcessFunction):
    def __init__(self, marker: str):
        self.marker = marker

    def open(self, ctx):
        self.count = ctx.get_state(ss.ValueStateDescriptor(
            "count", default=0, ttl=ss.StateTtlConfig(TTL)))

    def process_element(self, row, ctx):
        count = self.count.value() + 1
        self.count.update(count)
        if row["i"] == 2:
            open(self.marker, "w").close()
        yield {"i": row["i"], "key": ctx.current_key, "count": count}


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_value_state_forgets_keys_idle_longer_than_the_ttl(spark, tmp_path, backend):
    state_backend = (ss.RocksDBConfig(local_dir=str(tmp_path / "rocksdb"))
                     if backend == "rocksdb" else "hashmap")
    marker = str(tmp_path / "rows-0-2-processed")
    # buffer_timeout=0: rows before the pause leave the source at once.
    env = ss.StreamEnvironment(parallelism=1, spark=spark, state_backend=state_backend,
                               network=ss.NetworkConfig(buffer_timeout=0))
    (env.from_source(GatedGenerator(marker), name="events")
        .key_by("key").process(CountWithTtl(marker), name="count")
        .sink_to(ss.sinks.Collect(), name="out"))
    rows = sorted((r["i"], r["key"], r["count"]) for r in env.execute("state ttl").rows())
    # 'b' is written twice in a row (remembered); 'a' comes back after the pause: forgotten,
    # then counted again from 1.
    assert rows == [(0, "a", 1), (1, "b", 1), (2, "b", 2), (3, "a", 1), (4, "a", 2)]

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.state import (HashMapKeyedStateBackend, KeyGroupRange, StateError,
                              ValueStateDescriptor, assign_to_key_group)
from streamsnap.time import (MAX_WATERMARK, MIN_WATERMARK, TIME_WINDOW_NAMESPACE, InternalTimerService,
                             TimeDomain, Timer, TimeWindow)

MAX_P = 128
EVENT, PROCESSING = TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME


FULL = KeyGroupRange(0, MAX_P - 1)


def backend(kg_range=FULL):
    return HashMapKeyedStateBackend("op", MAX_P, kg_range)


def use_key(b, key):
    b.set_current_key(key, assign_to_key_group(key, MAX_P))


def fired(timers):
    return [(t.timestamp, t.key, t.namespace) for t in timers]


def test_event_time_timers_fire_in_order_once_with_their_key_current():
    b = backend()
    service = InternalTimerService(b)
    for key, ts in (("a", 30), ("b", 10), ("a", 20), ("c", 10), ("b", 10)):
        use_key(b, key)
        service.register_event_time_timer(ts)
    assert service.num_event_time_timers() == 4                # ("b", 10) deduplicated
    due = []
    for timer in service.advance_watermark(20):
        assert b.current_key == timer.key and timer.domain is EVENT
        due.append((timer.timestamp, timer.key))
    assert due == [(10, "b"), (10, "c"), (20, "a")]
    assert service.current_watermark == 20
    assert list(service.advance_watermark(25)) == []
    assert fired(service.advance_watermark(MAX_WATERMARK)) == [(30, "a", None)]
    assert service.num_event_time_timers() == 0 and service.next_event_time() is None


def test_timer_registered_while_firing_fires_in_the_same_advance():
    b = backend()
    service = InternalTimerService(b)
    use_key(b, 1)
    service.register_event_time_timer(5)
    seen = []
    for timer in service.advance_watermark(10):
        seen.append(timer.timestamp)
        if len(seen) == 1:
            service.register_event_time_timer(7)       # for the fired timer's key
            service.register_event_time_timer(5)       # again: it was removed, so a new one
            service.register_event_time_timer(11)      # after the watermark: waits
    assert seen == [5, 5, 7]
    assert fired(service.advance_watermark(11)) == [(11, 1, None)]


def test_delete_and_reregister():
    b = backend()
    service = InternalTimerService(b)
    use_key(b, "k")
    service.register_event_time_timer(10)
    service.register_event_time_timer(20)
    service.delete_event_time_timer(10)
    service.delete_event_time_timer(99)                # unknown: nothing happens
    use_key(b, "other")
    service.delete_event_time_timer(20)                # another key's timer: untouched
    use_key(b, "k")
    service.register_event_time_timer(10)
    assert service.next_event_time() == 10
    assert fired(service.advance_watermark(100)) == [(10, "k", None), (20, "k", None)]


def test_processing_time_timers_and_wake_up():
    b = backend()
    service = InternalTimerService(b)
    assert service.next_processing_time() is None
    use_key(b, "x")
    service.register_processing_time_timer(1_500)
    service.register_processing_time_timer(1_000)
    service.register_event_time_timer(1_000)
    assert service.next_processing_time() == 1_000
    timers = list(service.advance_processing_time(1_200))
    assert timers == [Timer(1_000, "x", None, PROCESSING)]
    assert service.current_processing_time == 1_200 and service.next_processing_time() == 1_500
    service.delete_processing_time_timer(1_500)
    assert service.next_processing_time() is None
    assert service.num_event_time_timers() == 1            # domains are separate


def test_namespaces_keep_timers_apart():
    b = backend()
    service = InternalTimerService(b, "window-timers", TIME_WINDOW_NAMESPACE)
    use_key(b, "k")
    w1, w2 = TimeWindow(0, 10), TimeWindow(5, 15)
    service.register_event_time_timer(9, w1)
    service.register_event_time_timer(9, w2)
    service.register_event_time_timer(14, w2)
    service.delete_event_time_timer(9, w2)
    assert fired(service.advance_watermark(20)) == [(9, "k", w1), (14, "k", w2)]


def test_timers_are_keyed_state_in_the_backend():
    b = backend()
    service = InternalTimerService(b)
    use_key(b, "k")
    service.register_event_time_timer(3)
    service.register_processing_time_timer(4)
    names = b.state_names()
    assert "_timers.user-timers.event_time" in names
    assert list(b.iter_entries("_timers.user-timers.event_time")) == [
        (assign_to_key_group("k", MAX_P), "k", {(3, None): True})]
    list(service.advance_watermark(3))
    assert list(b.iter_entries("_timers.user-timers.event_time")) == []


def test_misuse_is_reported():
    service = InternalTimerService(backend())
    with pytest.raises(StateError, match="without a current key"):
        service.register_event_time_timer(5)
    with pytest.raises(TypeError, match="register_event_time_timer.*int epoch milliseconds"):
        service.register_event_time_timer(5.5)
    with pytest.raises(ValueError, match="non-empty"):
        InternalTimerService(backend(), "")


def test_many_deletes_compact_the_heap():
    b = backend()
    service = InternalTimerService(b)
    use_key(b, 0)
    for ts in range(1_000):
        service.register_event_time_timer(ts)
    for ts in range(0, 1_000, 2):
        service.delete_event_time_timer(ts)
    for ts in range(1, 700, 2):
        service.delete_event_time_timer(ts)
    assert len(service._event._heap) < 500                 # stale entries were dropped
    assert [t.timestamp for t in service.advance_watermark(10_000)] == list(range(701, 1000, 2))


def test_snapshot_restores_every_timer_exactly_once_into_split_key_groups(location):
    source = backend()
    service = InternalTimerService(source, "window-timers", TIME_WINDOW_NAMESPACE)
    counter = source.get_state(ValueStateDescriptor("count", default=0))
    keys = list(range(300)) + [f"user-{i}" for i in range(100)] + [("t", i) for i in range(20)]
    expected = set()
    for i, key in enumerate(keys):
        use_key(source, key)
        counter.update(i)
        for ts in (i % 17 * 100, 5_000 + i):
            window = TimeWindow(ts - 50, ts + 1)
            service.register_event_time_timer(ts, window)
            expected.add((EVENT, ts, key, window))
        service.register_processing_time_timer(10_000 + i, TimeWindow(0, 1))
        expected.add((PROCESSING, 10_000 + i, key, TimeWindow(0, 1)))
    snapshot = source.snapshot(1, location)
    use_key(source, keys[0])
    service.register_event_time_timer(1, TimeWindow(0, 2))     # after the sync part: not in it
    handle = snapshot.run()

    halves = [KeyGroupRange(0, 63), KeyGroupRange(64, MAX_P - 1)]
    seen = []
    for kg_range in halves:
        half = backend(kg_range)
        half.restore([handle], location)
        timers = InternalTimerService(half, "window-timers", TIME_WINDOW_NAMESPACE)
        half_counter = half.get_state(ValueStateDescriptor("count", default=0))
        got = []
        for timer in timers.advance_watermark(MAX_WATERMARK):
            assert assign_to_key_group(timer.key, MAX_P) in kg_range
            assert half_counter.value() == keys.index(timer.key)   # its key's state is current
            got.append((EVENT, timer.timestamp, timer.key, timer.namespace))
        assert [g[1] for g in got] == sorted(g[1] for g in got)
        assert all(isinstance(g[3], TimeWindow) for g in got)
        got += [(PROCESSING, t.timestamp, t.key, t.namespace)
                for t in timers.advance_processing_time(MAX_WATERMARK)]
        assert timers.num_event_time_timers() == timers.num_processing_time_timers() == 0
        seen += got
    assert len(seen) == len(expected) and set(seen) == expected
    assert (EVENT, 1, keys[0], TimeWindow(0, 2)) not in seen


# --- property: random registrations, deletions and advances against a plain model --------

ops = st.lists(st.one_of(
    st.tuples(st.just("register"), st.integers(0, 5), st.integers(0, 40)),
    st.tuples(st.just("delete"), st.integers(0, 5), st.integers(0, 40)),
    st.tuples(st.just("advance"), st.integers(0, 5), st.integers(-5, 45)),
), min_size=5, max_size=80)


@settings(max_examples=examples(250), deadline=None)
@given(ops)
def test_timers_fire_in_order_each_once_like_a_plain_model(operations):
    b = backend()
    service = InternalTimerService(b)
    pending: dict[tuple, int] = {}            # (key, ts) -> registration order
    order = 0
    watermark = MIN_WATERMARK
    for op, key, value in operations:
        if op == "advance":
            watermark = max(watermark, value)      # event time never goes back
            due = sorted((ts, seq, k) for (k, ts), seq in pending.items() if ts <= watermark)
            for k, ts in [(k, ts) for ts, _, k in due]:
                del pending[(k, ts)]
            expected = [(ts, k) for ts, _, k in due]
            assert [(t.timestamp, t.key) for t in service.advance_watermark(value)] == expected
            continue
        use_key(b, key)
        if op == "register":
            service.register_event_time_timer(value)
            if (key, value) not in pending:
                pending[(key, value)] = order
                order += 1
        else:
            service.delete_event_time_timer(value)
            pending.pop((key, value), None)
        stored = {(k, ts) for _, k, timers in b.iter_entries("_timers.user-timers.event_time")
                  for ts, _ in timers}
        assert stored == set(pending)
        assert service.num_event_time_timers() == len(pending)

import pytest

from streamsnap.errors import ConfigurationError
from streamsnap.time import (MIN_WATERMARK, CountTrigger, EventTimeTrigger, NeverTrigger,
                             ProcessingTimeTrigger, PurgingTrigger, TimeWindow, Trigger,
                             TriggerResult, cleanup_time, is_element_late, is_window_late,
                             late_windows)
from streamsnap.time.watermarks import MAX_WATERMARK

CONTINUE, FIRE = TriggerResult.CONTINUE, TriggerResult.FIRE
PURGE, FIRE_AND_PURGE = TriggerResult.PURGE, TriggerResult.FIRE_AND_PURGE
W = TimeWindow(0, 10)


class Reducing:
    def __init__(self, store, slot, fn):
        self.store, self.slot, self.fn = store, slot, fn

    def get(self):
        return self.store.get(self.slot)

    def add(self, value):
        old = self.store.get(self.slot)
        self.store[self.slot] = value if old is None else self.fn(old, value)

    def clear(self):
        self.store.pop(self.slot, None)


class Context:
    """A dict-backed trigger context for one key; `window` is the window at hand."""

    def __init__(self, watermark=MIN_WATERMARK, now=0):
        self.watermark, self.now = watermark, now
        self.window = W
        self.merged = []
        self.event_timers, self.processing_timers = set(), set()
        self.state = {}

    def current_watermark(self):
        return self.watermark

    def current_processing_time(self):
        return self.now

    def register_event_time_timer(self, time):
        self.event_timers.add((self.window, time))

    def register_processing_time_timer(self, time):
        self.processing_timers.add((self.window, time))

    def delete_event_time_timer(self, time):
        self.event_timers.discard((self.window, time))

    def delete_processing_time_timer(self, time):
        self.processing_timers.discard((self.window, time))

    def get_partitioned_state(self, descriptor):
        return Reducing(self.state, (self.window, descriptor.name), descriptor.reduce_function)

    def merge_partitioned_state(self, descriptor):
        target = self.get_partitioned_state(descriptor)
        for window in self.merged:
            value = self.state.pop((window, descriptor.name), None)
            if value is not None:
                target.add(value)


def test_trigger_result_flags():
    assert [(r.is_fire, r.is_purge) for r in TriggerResult] == [
        (False, False), (True, False), (False, True), (True, True)]


def test_event_time_trigger_fires_at_window_end():
    trigger, ctx = EventTimeTrigger(), Context(watermark=3)
    assert trigger.on_element("x", 4, W, ctx) is CONTINUE
    assert ctx.event_timers == {(W, 9)}
    assert trigger.on_event_time(8, W, ctx) is CONTINUE
    assert trigger.on_event_time(9, W, ctx) is FIRE
    assert trigger.on_processing_time(9, W, ctx) is CONTINUE
    trigger.clear(W, ctx)
    assert ctx.event_timers == set()


def test_event_time_trigger_fires_at_once_for_late_allowed_element():
    ctx = Context(watermark=9)
    assert EventTimeTrigger().on_element("x", 2, W, ctx) is FIRE
    assert ctx.event_timers == set()


def test_event_time_trigger_merge_registers_only_future_timers():
    trigger = EventTimeTrigger()
    assert trigger.can_merge()
    ctx = Context(watermark=5)
    trigger.on_merge(W, ctx)
    assert ctx.event_timers == {(W, 9)}
    passed = Context(watermark=9)
    trigger.on_merge(W, passed)
    assert passed.event_timers == set()


def test_processing_time_trigger():
    trigger, ctx = ProcessingTimeTrigger(), Context(now=2)
    assert trigger.on_element("x", None, W, ctx) is CONTINUE
    assert ctx.processing_timers == {(W, 9)}
    assert trigger.on_event_time(9, W, ctx) is CONTINUE
    assert trigger.on_processing_time(9, W, ctx) is FIRE
    trigger.on_merge(W, Context(now=20))
    late = Context(now=20)
    trigger.on_merge(W, late)
    assert late.processing_timers == set()
    trigger.clear(W, ctx)
    assert ctx.processing_timers == set()


def test_count_trigger_fires_every_n_elements_per_window():
    trigger, ctx = CountTrigger.of(3), Context()
    results = [trigger.on_element(i, i, W, ctx) for i in range(7)]
    assert results == [CONTINUE, CONTINUE, FIRE, CONTINUE, CONTINUE, FIRE, CONTINUE]
    ctx.window = TimeWindow(10, 20)                         # another window counts on its own
    assert trigger.on_element(0, 10, ctx.window, ctx) is CONTINUE
    trigger.clear(ctx.window, ctx)
    ctx.window = W
    trigger.clear(W, ctx)
    assert ctx.state == {}


def test_count_trigger_merges_counts():
    trigger, ctx = CountTrigger.of(4), Context()
    a, b, merged = TimeWindow(0, 5), TimeWindow(6, 9), TimeWindow(0, 9)
    for window, n in ((a, 2), (b, 1)):
        ctx.window = window
        for _ in range(n):
            trigger.on_element(None, 0, window, ctx)
    ctx.window, ctx.merged = merged, [a, b]
    trigger.on_merge(merged, ctx)
    assert ctx.state == {(merged, "_trigger.count"): 3}
    assert trigger.on_element(None, 0, merged, ctx) is FIRE          # 2 + 1 + 1
    assert trigger.on_element(None, 0, merged, ctx) is CONTINUE


def test_purging_trigger_turns_fire_into_fire_and_purge():
    trigger = PurgingTrigger.of(CountTrigger.of(2))
    ctx = Context()
    assert trigger.on_element(1, 1, W, ctx) is CONTINUE
    assert trigger.on_element(2, 2, W, ctx) is FIRE_AND_PURGE
    event = PurgingTrigger.of(EventTimeTrigger())
    assert event.on_event_time(9, W, ctx) is FIRE_AND_PURGE
    assert event.on_event_time(8, W, ctx) is CONTINUE
    assert event.can_merge()


def test_never_trigger_and_merging_support():
    ctx = Context()
    never = NeverTrigger()
    assert {never.on_element(1, 1, W, ctx), never.on_event_time(9, W, ctx),
            never.on_processing_time(9, W, ctx)} == {CONTINUE}

    class OnlyOnce(Trigger):
        def on_element(self, element, timestamp, window, ctx):
            return FIRE

        def on_event_time(self, time, window, ctx):
            return PURGE

        def on_processing_time(self, time, window, ctx):
            return CONTINUE

        def clear(self, window, ctx):
            ctx.state.clear()

    assert not OnlyOnce().can_merge()
    with pytest.raises(ConfigurationError, match="cannot be used with merging"):
        OnlyOnce().on_merge(W, ctx)
    assert PurgingTrigger.of(OnlyOnce()).on_event_time(0, W, ctx) is PURGE


@pytest.mark.parametrize("build", [lambda: CountTrigger.of(0), lambda: CountTrigger.of(True),
                                   lambda: PurgingTrigger.of("fire")])
def test_bad_trigger_arguments(build):
    with pytest.raises(ConfigurationError, match=r"\.of\("):
        build()


def test_lateness():
    window = TimeWindow(0, 10)
    assert cleanup_time(window, 5, True) == 14
    assert cleanup_time(window, 5, False) == 9
    assert cleanup_time(TimeWindow(0, MAX_WATERMARK), 100, True) == MAX_WATERMARK
    assert not is_window_late(window, 0, 8) and is_window_late(window, 0, 9)
    assert not is_window_late(window, 5, 13) and is_window_late(window, 5, 14)
    assert not is_window_late(window, 0, 100, is_event_time=False)
    assert not is_element_late(9, 0, 8) and is_element_late(9, 0, 9)
    assert not is_element_late(9, 3, 11) and is_element_late(9, 3, 12)
    assert late_windows([10, 20, 30], 5, 24).tolist() == [True, True, False]

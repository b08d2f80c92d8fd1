"""Random interleavings of watermarks, idleness and channel ends, against a plain reference."""

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.time import MIN_WATERMARK, StatusWatermarkValve, Watermark, WatermarkStatus

IDLE, ACTIVE = WatermarkStatus.IDLE, WatermarkStatus.ACTIVE


class ReferenceValve:
    """The valve's rules restated without incremental bookkeeping: after every input the
    minimum is recomputed from scratch, and a channel counts when it is active, open and not
    behind the output (rather than through a remembered 'aligned' flag)."""

    def __init__(self, n):
        self.wm = [MIN_WATERMARK] * n
        self.idle = [False] * n
        self.done = [False] * n
        self.out = MIN_WATERMARK
        self.valve_idle = False

    def live(self, i):
        return not self.idle[i] and not self.done[i]

    def step_min(self):
        counted = [w for i, w in enumerate(self.wm) if self.live(i) and w >= self.out]
        if counted and min(counted) > self.out:
            self.out = min(counted)
            return [Watermark(self.out)]
        return []

    def leave(self, i):
        if any(self.live(j) for j in range(len(self.wm))):
            return self.step_min()
        out = []
        if self.wm[i] == self.out:
            highest = max(w for j, w in enumerate(self.wm) if not self.done[j])
            if highest > self.out:
                self.out = highest
                out.append(Watermark(highest))
        self.valve_idle = True
        return out + [IDLE]

    def watermark(self, i, t):
        if self.valve_idle or not self.live(i) or t <= self.wm[i]:
            return []
        self.wm[i] = t
        return self.step_min()

    def status(self, i, status):
        if self.done[i] or self.idle[i] == status.is_idle:
            return []
        if status.is_idle:
            self.idle[i] = True
            return self.leave(i)
        self.idle[i] = False
        if self.valve_idle:
            self.valve_idle = False
            return [ACTIVE]
        return []

    def end(self, i):
        if self.done[i]:
            return []
        was_idle, self.done[i] = self.idle[i], True
        if was_idle or all(self.done):
            return []
        return self.leave(i)


def schedules(allow_idle=True):
    kinds = ["wm", "wm", "wm", "idle", "active", "end"] if allow_idle else ["wm"] * 8 + ["end"]
    return st.integers(1, 4).flatmap(lambda n: st.tuples(st.just(n), st.lists(
        st.tuples(st.sampled_from(kinds), st.integers(0, n - 1), st.integers(-5, 40)),
        min_size=10, max_size=80)))


def apply(valve, kind, channel, ts):
    if kind == "wm":
        return valve.input_watermark(channel, ts)
    if kind == "idle":
        return valve.input_watermark_status(channel, IDLE)
    if kind == "active":
        return valve.input_watermark_status(channel, ACTIVE)
    return valve.input_end_of_partition(channel)


def ref_apply(ref, kind, channel, ts):
    if kind == "wm":
        return ref.watermark(channel, ts)
    if kind in ("idle", "active"):
        return ref.status(channel, IDLE if kind == "idle" else ACTIVE)
    return ref.end(channel)


@settings(max_examples=examples(400), deadline=None)
@given(schedules())
def test_valve_matches_reference_and_is_monotonic(schedule):
    n, events = schedule
    valve, ref = StatusWatermarkValve(n), ReferenceValve(n)
    emitted = []
    highest_input = MIN_WATERMARK
    for kind, channel, ts in events:
        if kind == "wm":
            highest_input = max(highest_input, ts)
        out = apply(valve, kind, channel, ts)
        assert out == ref_apply(ref, kind, channel, ts), (kind, channel, ts)
        emitted += [e.timestamp for e in out if isinstance(e, Watermark)]
        assert valve.watermark == ref.out and valve.status.is_idle == ref.valve_idle
        statuses = [e for e in out if isinstance(e, WatermarkStatus)]
        assert len(statuses) <= 1 and (not statuses or statuses[-1] is out[-1])
    assert emitted == sorted(set(emitted))                  # strictly increasing
    assert all(w <= highest_input for w in emitted)         # never invents progress


@settings(max_examples=examples(300), deadline=None)
@given(schedules(allow_idle=False))
def test_without_idleness_output_is_min_over_open_channels(schedule):
    n, events = schedule
    valve = StatusWatermarkValve(n)
    latest = [MIN_WATERMARK] * n
    closed = [False] * n
    expected = MIN_WATERMARK
    for kind, channel, ts in events:
        if kind == "wm":
            if not closed[channel]:
                latest[channel] = max(latest[channel], ts)
            valve.input_watermark(channel, ts)
        else:
            closed[channel] = True
            valve.input_end_of_partition(channel)
        open_marks = [w for w, c in zip(latest, closed) if not c]
        if open_marks:
            expected = max(expected, min(open_marks))
        assert valve.watermark == expected

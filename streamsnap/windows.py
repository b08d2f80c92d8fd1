"""`ss.windows`: everything a user needs to write a windowed job, in one namespace.

The pieces live where their concepts do — assigners and windows in `time/windows.py`,
triggers in `time/triggers.py`, the functions in `api/windowing.py` — and are gathered here so
a job reads `ss.windows.TumblingEventTimeWindows.of(60)` and `ss.windows.CountTrigger.of(100)`.

Units: every assigner takes durations in seconds (int or float) or as a `datetime.timedelta`,
in its constructor and in its `of` / `with_gap` class methods alike, so
`EventTimeSessionWindows(30)` and `EventTimeSessionWindows.with_gap(30)` are both a 30-second
gap. Windows (`TimeWindow.start` / `.end`) are event timestamps: int epoch milliseconds.
"""

from streamsnap.api.all_windows import AllWindowedStream, ProcessAllWindowFunction
from streamsnap.api.windowing import AggregateFunction, ProcessWindowFunction, WindowedStream
from streamsnap.time.triggers import (CountTrigger, EventTimeTrigger, NeverTrigger,
                                      ProcessingTimeTrigger, PurgingTrigger, Trigger,
                                      TriggerContext, TriggerResult)
from streamsnap.time.windows import (GLOBAL_WINDOW, EventTimeSessionWindows, GlobalWindow,
                                     GlobalWindows, ProcessingTimeSessionWindows,
                                     SlidingEventTimeWindows, SlidingProcessingTimeWindows,
                                     TimeWindow, TumblingEventTimeWindows,
                                     TumblingProcessingTimeWindows, Window, WindowAssigner)

__all__ = [
    "AggregateFunction", "ProcessWindowFunction", "WindowedStream", "AllWindowedStream",
    "ProcessAllWindowFunction",
    "CountTrigger", "EventTimeTrigger", "NeverTrigger", "ProcessingTimeTrigger",
    "PurgingTrigger", "Trigger", "TriggerContext", "TriggerResult",
    "GLOBAL_WINDOW", "EventTimeSessionWindows", "GlobalWindow", "GlobalWindows",
    "ProcessingTimeSessionWindows", "SlidingEventTimeWindows", "SlidingProcessingTimeWindows",
    "TimeWindow", "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "Window",
    "WindowAssigner",
]


def __dir__() -> list[str]:
    return sorted(__all__)

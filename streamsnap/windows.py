"""`ss.windows`: everything a user needs to write a windowed job, in one namespace.

The pieces live where their concepts do — assigners and windows in `time/windows.py`,
triggers in `time/triggers.py`, the functions in `api/windowing.py` — and are gathered here so
a job reads `ss.windows.TumblingEventTimeWindows.of(60)` and `ss.windows.CountTrigger.of(100)`.
"""

from streamsnap.api.windowing import AggregateFunction, ProcessWindowFunction, WindowedStream
from streamsnap.time.triggers import (CountTrigger, EventTimeTrigger, NeverTrigger,
                                      ProcessingTimeTrigger, PurgingTrigger, Trigger,
                                      TriggerContext, TriggerResult)
from streamsnap.time.windows import (GLOBAL_WINDOW, EventTimeSessionWindows, GlobalWindow,
                                     GlobalWindows, ProcessingTimeSessionWindows,
                                     SlidingEventTimeWindows, SlidingProcessingTimeWindows,
                                     TimeWindow, TumblingEventTimeWindows,
                                     TumblingProcessingTimeWindows, Window, WindowAssigner,
                                     window_start, window_starts)

__all__ = [
    "AggregateFunction", "ProcessWindowFunction", "WindowedStream",
    "CountTrigger", "EventTimeTrigger", "NeverTrigger", "ProcessingTimeTrigger",
    "PurgingTrigger", "Trigger", "TriggerContext", "TriggerResult",
    "GLOBAL_WINDOW", "EventTimeSessionWindows", "GlobalWindow", "GlobalWindows",
    "ProcessingTimeSessionWindows", "SlidingEventTimeWindows", "SlidingProcessingTimeWindows",
    "TimeWindow", "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "Window",
    "WindowAssigner", "window_start", "window_starts",
]

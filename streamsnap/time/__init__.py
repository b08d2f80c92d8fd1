"""Event time: timestamps, watermarks, timers and windows, as sans-I/O cores.

Everything here is plain classes fed events and a clock that return decisions; the runtime
(tasks, sources, window operators) wires them to channels, mailboxes and the state backend.
Event time is int epoch milliseconds; API durations are seconds or timedelta.
"""

from streamsnap.runtime.events import Watermark
from streamsnap.time.combined import CombinedWatermark
from streamsnap.time.durations import to_millis
from streamsnap.time.lateness import cleanup_time, is_element_late, is_window_late, late_windows
from streamsnap.time.merging import MergeFunction, MergingWindowSet
from streamsnap.time.split_watermarks import SplitWatermarks
from streamsnap.time.timers import (PLAIN_NAMESPACE, InternalTimerService, NamespaceCodec,
                                    TimeDomain, Timer)
from streamsnap.time.timestamps import TimestampError, assign_timestamp, extract_timestamps
from streamsnap.time.triggers import (CountTrigger, EventTimeTrigger, NeverTrigger,
                                      OnMergeContext, ProcessingTimeTrigger, PurgingTrigger,
                                      Trigger, TriggerContext, TriggerResult)
from streamsnap.time.valve import StatusWatermarkValve
from streamsnap.time.watermarks import (MAX_WATERMARK, MIN_WATERMARK,
                                        BoundedOutOfOrdernessWatermarks, IdlenessDetector,
                                        MonotonicWatermarkOutput, NoWatermarksGenerator,
                                        WatermarkEvent, WatermarkGenerator, WatermarkOutput,
                                        WatermarkStatus, WatermarkStrategy)
from streamsnap.time.windows import (GLOBAL_WINDOW, GLOBAL_WINDOW_NAMESPACE,
                                     TIME_WINDOW_NAMESPACE, EventTimeSessionWindows,
                                     GlobalWindow, GlobalWindows, ProcessingTimeSessionWindows,
                                     SlidingEventTimeWindows, SlidingProcessingTimeWindows,
                                     TimeWindow, TumblingEventTimeWindows,
                                     TumblingProcessingTimeWindows, Window, WindowAssigner,
                                     merge_time_windows, window_start, window_starts)

__all__ = [
    "GLOBAL_WINDOW", "GLOBAL_WINDOW_NAMESPACE", "MAX_WATERMARK", "MIN_WATERMARK",
    "PLAIN_NAMESPACE", "TIME_WINDOW_NAMESPACE", "BoundedOutOfOrdernessWatermarks",
    "CombinedWatermark", "CountTrigger", "EventTimeSessionWindows", "EventTimeTrigger",
    "GlobalWindow", "GlobalWindows", "IdlenessDetector", "InternalTimerService",
    "MergeFunction", "MergingWindowSet", "MonotonicWatermarkOutput", "NamespaceCodec",
    "NeverTrigger", "NoWatermarksGenerator", "OnMergeContext", "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger", "PurgingTrigger", "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows", "SplitWatermarks", "StatusWatermarkValve", "TimeDomain",
    "TimeWindow", "Timer", "TimestampError", "Trigger", "TriggerContext", "TriggerResult",
    "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "Watermark", "WatermarkEvent",
    "WatermarkGenerator", "WatermarkOutput", "WatermarkStatus", "WatermarkStrategy", "Window",
    "WindowAssigner", "assign_timestamp", "cleanup_time", "extract_timestamps",
    "is_element_late", "is_window_late", "late_windows", "merge_time_windows", "to_millis",
    "window_start", "window_starts",
]

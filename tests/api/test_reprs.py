"""Result objects print a short, readable summary: one line for repr, a few lines for str."""

from __future__ import annotations

from streamsnap.api.jobs import JobInfo
from streamsnap.api.result import JobClient, JobResult, OperatorMetrics, SubtaskInfo
from streamsnap.checkpoint.messages import CheckpointMetrics
from streamsnap.checkpoint.stats import CheckpointStatsTracker
from streamsnap.graph.ids import ExecutionAttemptId
from streamsnap.runtime.events import CheckpointType


def busy_stats(checkpoints: int = 10, subtasks: int = 16):
    """A tracker's snapshot with a full history of checkpoints with many subtasks each (whose
    dataclass repr ran to ~10 KB)."""
    tracker = CheckpointStatsTracker()
    for n in range(1, checkpoints + 1):
        tracker.report_pending(n, 100.0 * n, CheckpointType.CHECKPOINT, subtasks)
        for i in range(subtasks):
            tracker.report_subtask(n, ExecutionAttemptId("source__events-0", i, 0), 100.0 * n + 0.5, 1000,
                                   CheckpointMetrics(0.1, 0.2, 0.0, 0.01, 0, 0))
        tracker.report_completed(n, 100.0 * n + 1.25, 1000 * subtasks, f"file:///ckpt/job/chk-{n}")
    tracker.report_pending(checkpoints + 1, 5000.0, CheckpointType.CHECKPOINT, subtasks)
    return tracker.snapshot()


def test_checkpoint_stats_repr_is_one_short_line_and_str_is_the_description():
    stats = busy_stats()
    text = repr(stats)
    assert "\n" not in text and len(text) < 200, text
    assert text == ("<CheckpointStatsSnapshot 10 completed, 0 failed, 1 in progress, 0 restored; "
                    "latest completed: 10 in 1.250 s, 16000 bytes>")
    assert str(stats) == stats.describe() and len(str(stats).splitlines()) <= 6
    assert "\n" not in repr(stats.latest_completed) and len(repr(stats.latest_completed)) < 200
    assert repr(stats.latest_completed).startswith("<CheckpointStats checkpoint 10 COMPLETED in 1.250 s")


def test_job_result_repr_is_one_line_and_str_is_the_summary():
    metrics = {f"op-{i}": OperatorMetrics(f"op {i}", f"op-{i}", 4, 10 ** 6, 10 ** 6) for i in range(20)}
    rows = [{"key": i, "value": i} for i in range(100_000)]
    result = JobResult("wc-1a2b", "word count", "FINISHED", 2.345, metrics, {"out": rows},
                       checkpoints=busy_stats(), restarts=1)
    assert repr(result) == ("<JobResult 'word count' (wc-1a2b) FINISHED in 2.35 s, 20 operator(s), "
                            "1 collect sink(s) with 100,000 row(s), 10 checkpoint(s), 1 restart(s)>")
    assert str(result) == result.summary()
    assert result.summary().splitlines()[0] == "job 'word count' FINISHED in 2.35 s after 1 restart(s)"
    assert len(result.summary().splitlines()) == 22


def test_job_info_repr_is_one_line_with_the_first_line_of_the_failure():
    info = JobInfo("clicks-1a2b3c4d", "clicks", "RUNNING", 1.7e9, 0, 2, False, ("10.0.0.1", 4000),
                   "Traceback (most recent call last):\n  File ...\nValueError: boom")
    assert repr(info) == ("<JobInfo clicks-1a2b3c4d 'clicks' RUNNING, not answering, 2 restart(s), "
                          "last failure: Traceback (most recent call last):>")
    ok = JobInfo("j", "job", "FINISHED", None, None, 0, False, None, None)
    assert repr(ok) == "<JobInfo j 'job' FINISHED, not answering, 0 restart(s)>"


def test_subtask_info_and_job_client_print_their_identity():
    info = SubtaskInfo("source__events-0", 1, 0, "host-a", 123, "RUNNING", 3, vertex_name="Source: events -> Map")
    assert str(info) == "source__events-0[1] 'Source: events -> Map' RUNNING (attempt 0, host-a pid 123)"

    class Master:
        job_id = "clicks-1a2b3c4d"

    assert repr(JobClient(Master())) == "<JobClient clicks-1a2b3c4d>"

"""How a failed Spark job is named in a restart's cause: the first meaningful line, plus, for a
barrier stage one task aborted, why that task failed (so a task that died without telling the
JobMaster still leaves its reason in `recoveries`)."""

from streamsnap.cluster.spark_errors import spark_error_summary as _spark_error_summary

BARRIER = ("An error occurred while calling o123.collect.\n"
           ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a "
           "failed barrier ResultStage. Most recent failure reason: Stage failed because barrier task "
           "ResultTask(18, 3) finished unsuccessfully.\n")


def test_a_barrier_stage_failure_names_the_task_s_python_error():
    error = Exception(BARRIER + "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
                      '  File "/w/worker.py", line 5, in main\n    raise RuntimeError("boom")\n'
                      "RuntimeError: boom\n\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:572)\n")
    summary = _spark_error_summary(error)
    assert summary.startswith("the Spark job failed: : org.apache.spark.SparkException: Job aborted")
    assert "the task's failure: org.apache.spark.api.python.PythonException" in summary
    assert summary.endswith("RuntimeError: boom") and "PythonRunner.scala" not in summary


def test_a_lost_executor_and_a_plain_error_are_named_as_they_are():
    lost = _spark_error_summary(Exception(BARRIER + "ExecutorLostFailure (executor driver exited) Reason: gone"))
    assert lost.endswith("the task's failure: ExecutorLostFailure (executor driver exited) Reason: gone")
    assert _spark_error_summary(Exception("plain failure")) == "the Spark job failed: plain failure"


def test_a_connect_server_s_error_names_the_python_exception_not_the_jvm_one_after_it():
    """Spark Connect puts the JVM exception's name after the Python traceback."""
    error = Exception(
        "[STAGE_FAILED] Job aborted due to stage failure: ShuffleMapStage 1 (repartition) has failed the maximum "
        "allowable number of times: 4. Most recent failure reason: Stage failed because barrier task "
        "ShuffleMapTask(1, 0) finished unsuccessfully.\n"
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the Python "
        "worker: Traceback (most recent call last):\n"
        '  File "/x/pyspark/worker.py", line 2145, in process\n'
        "ModuleNotFoundError: No module named 'benchmarks'\n"
        " SQLSTATE: 38000\n"
        "JVM stacktrace:\n"
        "org.apache.spark.SparkException: Job aborted due to stage failure\n")
    summary = _spark_error_summary(error)
    assert summary.endswith("ModuleNotFoundError: No module named 'benchmarks'"), summary

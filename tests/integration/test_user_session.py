"""A user's own SparkSession whose executors' Python cannot import streamsnap.

The driver is a real process that builds its SparkSession the PySpark way, with
`PYSPARK_PYTHON` pointing at a Python that has streamsnap's dependencies but not
streamsnap (started with `-S`, so the editable install's finder never loads). `execute()` must
notice before the job's barrier stage, ship the package with `SparkContext.addPyFile`, and the
job must then run on those executors with exact output. A second session, whose executors also
lack pyarrow, must fail at once with an error saying what to install or set.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import sysconfig
import textwrap

import pytest

pytestmark = pytest.mark.spark

DRIVER = textwrap.dedent('''
    import json, os, sys, time
    from pyspark.sql import SparkSession
    import streamsnap as ss

    def session(python):
        os.environ["PYSPARK_PYTHON"] = python   # how PySpark picks the executors' Python
        return (SparkSession.builder.master("local[4]").appName("a user's session")
                .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                .getOrCreate())

    class RunningSum(ss.KeyedProcessFunction):
        def open(self, ctx):
            self.total = ctx.get_state(ss.ValueStateDescriptor("total", default=0))

        def process_element(self, row, ctx):
            total = self.total.value() + row["value"]
            self.total.update(total)
            yield {"key": ctx.current_key, "value": total}

    def job(spark):
        env = ss.StreamEnvironment(parallelism=2, spark=spark)
        rows = env.from_collection([{"key": i % 5, "value": i} for i in range(200)], name="rows")
        rows.key_by("key").process(RunningSum(), name="sum").sink_to(ss.sinks.Collect(), name="out")
        return env.execute("user-session")

    report = {}
    begun = time.monotonic()
    spark = session(sys.argv[1])
    report["session_seconds"] = time.monotonic() - begun
    probe = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").flags.no_site).collect()
    report["executor_no_site"] = probe[0]
    begun = time.monotonic()
    result = job(spark)
    report["job_seconds"] = time.monotonic() - begun
    report["rows"] = sorted([r["key"], r["value"]] for r in result.rows("out"))
    report["py_files"] = [f for f in spark.sparkContext._python_includes]
    spark.stop()

    spark = session(sys.argv[2])
    started = time.monotonic()
    try:
        job(spark)
        report["error"] = None
    except ss.PreflightError as exc:
        report["error"] = str(exc)
    report["seconds_to_error"] = time.monotonic() - started
    spark.stop()
    print("REPORT " + json.dumps(report))
''')


def _python_without_streamsnap(directory, shadow: str | None = None) -> str:
    """An executable that runs this Python with its site-packages on the path but not the
    editable streamsnap install (`-S` skips the .pth that installs its finder); optionally with
    one more package missing."""
    path = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    if shadow is not None:
        shim = directory / "shim" / shadow
        shim.mkdir(parents=True)
        (shim / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{shadow}'\")\n")
        path.insert(0, str(directory / "shim"))
    wrapper = directory / ("python-without-streamsnap" + (f"-or-{shadow}" if shadow else ""))
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{os.pathsep.join(path)}" '
                       f'exec {sys.executable} -S "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def test_executors_without_streamsnap_get_it_shipped_and_the_job_runs_or_fail_naming_the_fix(tmp_path):
    # Sanity of the set-up: that Python really cannot import streamsnap on its own.
    # Without the PYTHONPATH an embedded session of this test run put the repository on.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bare = _python_without_streamsnap(tmp_path)
    check = subprocess.run([bare, "-c", "import pyarrow, msgpack\nimport streamsnap"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode != 0 and "No module named 'streamsnap'" in check.stderr, check.stderr

    no_pyarrow = _python_without_streamsnap(tmp_path, shadow="pyarrow")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    # cwd outside the repository: executors started with `-m` put their cwd on sys.path.
    done = subprocess.run([sys.executable, str(script), bare, no_pyarrow], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"driver failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    report = json.loads(lines[0][len("REPORT "):])
    print({k: v for k, v in report.items() if k.endswith("seconds") or k.endswith("to_error")})

    assert report["executor_no_site"] == 1          # the job's tasks ran on that Python
    totals = {k: sum(i for i in range(200) if i % 5 == k) for k in range(5)}
    finals = {}
    for key, value in report["rows"]:
        finals[key] = max(finals.get(key, 0), value)
    assert finals == totals and len(report["rows"]) == 200
    assert any(f.endswith("streamsnap.zip") for f in report["py_files"]), report["py_files"]

    error = report["error"]
    assert error is not None, "a job on executors without pyarrow must fail in the pre-flight check"
    assert "the Spark executors cannot import streamsnap, even after it was shipped" in error
    assert "No module named 'pyarrow'" in error and no_pyarrow in error
    assert "PYSPARK_PYTHON" in error and "spark.pyspark.python" in error and "spark.submit.pyFiles" in error
    assert report["seconds_to_error"] < 120   # seconds, not a barrier stage's retries


BUILDER_DRIVER = textwrap.dedent('''
    import json, os, sys, time
    started = time.monotonic()
    assert "PYSPARK_PYTHON" not in os.environ and "PYSPARK_DRIVER_PYTHON" not in os.environ
    from pyspark.sql import SparkSession
    import streamsnap as ss

    spark = (SparkSession.builder.master("local[2]").appName("as a user builds it")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    report = {"default_python": spark.sparkContext.pythonExec}
    def pyarrow_imports(_):
        try:
            import pyarrow
            return True
        except ImportError:
            return False

    # What PySpark alone starts: the `python3` on PATH, here one without pyarrow.
    report["plain_worker_has_pyarrow"] = spark.sparkContext.parallelize([0], 1).map(pyarrow_imports).collect()[0]
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    rows = env.from_collection([{"key": i % 5, "value": i} for i in range(200)], name="rows")
    (rows.key_by("key").map(lambda r: {**r, "python": "%s no_site=%d" % (__import__("sys").executable, __import__("sys").flags.no_site)}, name="tag")
        .sink_to(ss.sinks.Collect(), name="out"))
    result = env.execute("builder session")
    report["rows"] = sorted([r["key"], r["value"]] for r in result.rows("out"))
    report["seconds"] = time.monotonic() - started
    report["task_pythons"] = sorted({r["python"] for r in result.rows("out")})
    report["python_after"] = spark.sparkContext.pythonExec
    spark.stop()
    print("REPORT " + json.dumps(report))
''')


def test_a_builder_session_without_environment_variables_runs_on_the_drivers_python(tmp_path):
    """SparkSession.builder.master("local[2]").getOrCreate() with no PYSPARK_PYTHON, and a
    `python3` on PATH that lacks pyarrow (as a system Python often does): streamsnap's tasks run
    on the driver's interpreter, and the job's output is exact."""
    shadowed = _python_without_streamsnap(tmp_path, shadow="pyarrow")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(shadowed)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    # This checkout's streamsnap for the driver (and, through the environment, its local workers).
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "driver.py"
    script.write_text(BUILDER_DRIVER)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, f"driver failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    report = json.loads(lines[0][len("REPORT "):])
    print(f"builder session: {report['seconds']:.1f} s from the session's start to the job's result")
    assert report["default_python"] == "python3"
    assert report["plain_worker_has_pyarrow"] is False        # the set-up: PySpark's default lacks pyarrow
    assert report["python_after"] == sys.executable and report["task_pythons"] == [f"{sys.executable} no_site=0"]
    assert report["rows"] == sorted([i % 5, i] for i in range(200))

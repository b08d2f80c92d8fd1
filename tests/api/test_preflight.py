"""execute()'s up-front checks (api/preflight.py): each mistake fails before any Spark job, named."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

import streamsnap as ss
from streamsnap.api import preflight
from streamsnap.api.result import JobResult, OperatorMetrics


def rows():
    return [{"k": i % 3, "v": i} for i in range(10)]


def test_an_unusable_checkpoint_directory_fails_execute_at_once_naming_path_and_os_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    directory = blocker / "ckpt"
    env = ss.StreamEnvironment(parallelism=1, checkpointing=ss.CheckpointConfig(directory=str(directory)))
    env.from_collection(rows()).sink_to(ss.sinks.Collect())
    started = time.monotonic()
    with pytest.raises(ss.PreflightError) as info:
        env.execute("bad checkpoint dir")
    text = str(info.value)
    assert f"the checkpoint directory '{directory}' is not usable: could not create it" in text
    assert "Error" in text and "[Errno" in text  # the OS error, e.g. NotADirectoryError / FileExistsError
    assert "CheckpointConfig(directory=...)" in text and "tolerable_failures" not in text
    assert time.monotonic() - started < 5


def test_a_usable_directory_is_created_and_left_without_the_probe(tmp_path):
    preflight.check_directory(str(tmp_path / "new" / "ckpt"), "the checkpoint directory", "x")
    assert os.listdir(tmp_path / "new" / "ckpt") == []


def test_a_captured_lock_fails_execute_naming_the_operator_and_the_object():
    lock = threading.Lock()

    def guarded(row):
        with lock:
            return row

    env = ss.StreamEnvironment(parallelism=1)
    env.from_collection(rows()).map(guarded, name="locked").sink_to(ss.sinks.Collect())
    with pytest.raises(ss.PreflightError) as info:
        env.execute("captures a lock")
    text = str(info.value)
    assert "operator 'locked'" in text and "closure variable 'lock'" in text and "_thread.lock" in text
    assert "open()" in text  # the fix


def test_an_unpicklable_attribute_of_a_function_object_is_found():
    class Enricher(ss.KeyedProcessFunction):
        def __init__(self):
            self.settings = {"retries": 3, "guard": threading.RLock()}

        def process_element(self, row, ctx):
            yield row

    env = ss.StreamEnvironment(parallelism=1)
    env.from_collection(rows()).key_by("k").process(Enricher(), name="enrich").sink_to(ss.sinks.Collect())
    with pytest.raises(ss.PreflightError, match=r"operator 'enrich'.*attribute 'settings'\['guard'\].*RLock"):
        env.execute("captures an rlock")


def test_file_sink_modes_on_existing_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-0-old.parquet").write_bytes(b"x")
    (out / "_SUCCESS").write_bytes(b"")
    env = ss.StreamEnvironment(parallelism=1)
    env.from_collection(rows()).sink_to(ss.sinks.FileSink(str(out)), name="files")
    with pytest.raises(ss.ConfigurationError) as info:
        env.execute("into existing output")
    text = str(info.value)
    assert f"FileSink 'files': the output directory '{out}' already holds 1 file(s) (part-0-old.parquet)" in text
    assert "mode='append'" in text and "mode='overwrite'" in text and "restore_from" in text
    ss.sinks.FileSink(str(out), mode="append").check_output("files", resuming=False)
    ss.sinks.FileSink(str(out)).check_output("files", resuming=True)   # a resumed job continues its output
    assert sorted(os.listdir(out)) == ["_SUCCESS", "part-0-old.parquet"]
    ss.sinks.FileSink(str(out), mode="overwrite").check_output("files", resuming=False)
    assert os.listdir(out) == []
    with pytest.raises(ss.ConfigurationError, match="FileSink.mode must be one of 'error_if_exists', 'append', 'overwrite'"):
        ss.sinks.FileSink(str(out), mode="ignore")


def test_the_summary_labels_counts_of_an_attempt_that_restored_a_checkpoint():
    metrics = {"src": OperatorMetrics("Source: events", "src", 2, 400, 400)}
    plain = JobResult("j", "job", "FINISHED", 1.0, metrics, {})
    assert "record counts" not in plain.summary()
    restored = JobResult("j", "job", "FINISHED", 1.0, metrics, {}, restarts=1, attempt=1, restored_checkpoint=4)
    assert ("record counts below: attempt 2 only, since it restored checkpoint 4 — rows before that checkpoint "
            "were processed by earlier attempts") in restored.summary()


# ----------------------------------------------------------------------- executors
class _StandInContext:
    """A SparkContext whose 'executors' are fresh Python processes that cannot import streamsnap.

    They run the real probe, pickled by PySpark's cloudpickle, with site-packages on their path
    but not the editable install; `addPyFile` puts a file on their path, as Spark does.
    """

    def __init__(self, tmp_path, shadow: str | None = None):
        import pyarrow
        self.applicationId = f"stand-in-{uuid.uuid4().hex}"
        self.master = "local[2]"
        self.defaultParallelism = 2
        self.py_files: list[str] = []
        self.probes = 0
        self._cwd = tmp_path
        self._path = [os.path.dirname(os.path.dirname(pyarrow.__file__))]
        if shadow is not None:  # a package the executors lack, e.g. pyarrow
            shim = tmp_path / "shim" / shadow
            shim.mkdir(parents=True)
            (shim / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{shadow}'\")\n")
            self._path.insert(0, str(tmp_path / "shim"))

    def addPyFile(self, path):
        self.py_files.append(path)

    def parallelize(self, data, n):
        return _StandInRDD(self, list(data))

    def run(self, fn, data):
        from pyspark import cloudpickle

        self.probes += 1
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(self.py_files + self._path))
        code = "import pickle, sys; fn = pickle.loads(sys.stdin.buffer.read()); print(repr(list(fn(iter([0])))))"
        done = subprocess.run([sys.executable, "-S", "-c", code], input=cloudpickle.dumps(fn), env=env,
                              cwd=self._cwd, capture_output=True, timeout=120, check=True)
        return eval(done.stdout.decode())  # noqa: S307 - our own probe's repr of plain tuples


class _StandInRDD:
    def __init__(self, sc, data):
        self._sc, self._data, self._fn = sc, data, None

    def mapPartitions(self, fn):
        self._fn = fn
        return self

    def collect(self):
        return self._sc.run(self._fn, self._data)


def test_executors_without_streamsnap_get_it_shipped_once(tmp_path):
    sc = _StandInContext(tmp_path)
    preflight.check_executors(SimpleNamespace(sparkContext=sc))
    assert len(sc.py_files) == 1 and sc.py_files[0].endswith("streamsnap.zip") and sc.probes == 2
    preflight.check_executors(SimpleNamespace(sparkContext=sc))   # verified once per SparkContext
    assert sc.probes == 2


def test_executors_that_cannot_import_it_even_shipped_say_what_to_install_or_set(tmp_path):
    sc = _StandInContext(tmp_path, shadow="pyarrow")
    with pytest.raises(ss.PreflightError) as info:
        preflight.check_executors(SimpleNamespace(sparkContext=sc))
    text = str(info.value)
    assert "the Spark executors cannot import streamsnap, even after it was shipped" in text
    assert "No module named 'pyarrow'" in text and sys.executable in text
    assert "SparkSession.builder.config('spark.pyspark.python', PATH)" in text and "spark.submit.pyFiles" in text


def test_executors_with_another_streamsnap_version_are_refused_naming_both(tmp_path):
    sc = _StandInContext(tmp_path)
    old = tmp_path / "old" / "streamsnap"       # an older release installed on the executors
    old.mkdir(parents=True)
    (old / "__init__.py").write_text("__version__ = '0.0.9'\n")
    sc._path.insert(0, str(tmp_path / "old"))
    with pytest.raises(ss.PreflightError) as info:
        preflight.check_executors(SimpleNamespace(sparkContext=sc))
    text = str(info.value)
    assert f"the Spark executors run streamsnap 0.0.9 ({old / '__init__.py'}" in text
    assert f"this driver runs {ss.__version__}: both must run the same version" in text
    assert f"pip install 'streamsnap=={ss.__version__}'" in text and sc.py_files == []


def test_the_executors_python_advice_names_the_setting_that_works_for_the_session(monkeypatch):
    from streamsnap.cluster.spark_session import executor_python_fix

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    local = executor_python_fix(SimpleNamespace(kind="classic", master="local[4]"))
    assert "spark.pyspark.python" in local and repr(sys.executable) in local and "PYSPARK_PYTHON" not in local
    cluster = executor_python_fix(SimpleNamespace(kind="classic", master="spark://head:7077"))
    assert "spark.pyspark.python" in cluster and "its path on every executor" in cluster
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python")
    assert "overrides PYSPARK_PYTHON='/opt/py/bin/python'" in executor_python_fix(
        SimpleNamespace(kind="classic", master="yarn"))
    connect = executor_python_fix(SimpleNamespace(kind="connect", master="sc://h:15002"))
    assert "on the Spark Connect server" in connect and "builder" not in connect


@pytest.mark.spark
def test_a_failed_preflight_leaves_no_copy_of_a_dataframe_behind(spark, tmp_path):
    lock = threading.Lock()

    def guarded(row):
        with lock:
            return row

    frame = spark.createDataFrame([(i % 3, i) for i in range(1000)], "k long, v long")
    env = ss.StreamEnvironment(parallelism=1, spark=spark,
                               checkpointing=ss.CheckpointConfig(directory=str(tmp_path / "ckpt")))
    env.from_dataframe(frame, name="frame").map(guarded, name="locked").sink_to(ss.sinks.Collect())
    for _ in range(2):
        with pytest.raises(ss.PreflightError, match="operator 'locked'"):
            env.execute("fails its preflight")
    written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert written == [], written      # no Parquet copy, per try or at all


def test_the_shipped_package_zip_is_complete_and_deleted_when_the_process_exits(tmp_path):
    code = ("import zipfile\nfrom streamsnap.api import preflight\npath = preflight.package_zip()\n"
            "names = zipfile.ZipFile(path).namelist()\n"
            "assert 'streamsnap/__init__.py' in names and 'streamsnap/api/preflight.py' in names\n"
            "assert not any('__pycache__' in n for n in names)\nprint(path)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    path = done.stdout.strip()
    assert path.endswith("streamsnap.zip") and not os.path.exists(os.path.dirname(path))


class Conf(SimpleNamespace):
    """A bridge's master and configuration, for the worker-daemon advice's decision alone."""

    def conf(self, key, default=None):
        return self.settings.get(key, default)


def test_a_cluster_without_the_worker_daemon_is_told_how_to_preload_once_per_check(caplog):
    from streamsnap.cluster.spark_session import WORKER_DAEMON

    cluster = Conf(master="spark://10.0.0.5:7077", settings={})
    with caplog.at_level("WARNING", logger=preflight.log.name):
        assert preflight.advise_worker_daemon(cluster)
    assert f"spark.python.daemon.module', '{WORKER_DAEMON}'" in caplog.text and "pyspark.daemon" in caplog.text
    assert not preflight.advise_worker_daemon(Conf(master="spark://h:7077",
                                                   settings={"spark.python.daemon.module": WORKER_DAEMON}))
    assert not preflight.advise_worker_daemon(Conf(master="local[4]", settings={}))
    assert not preflight.advise_worker_daemon(Conf(master="yarn", settings={"spark.python.use.daemon": "false"}))
    assert preflight.advise_worker_daemon(Conf(master="yarn", settings={"spark.python.daemon.module": "my.daemon"}))

"""The Spark session jobs run on: the user's, or an embedded `local[N]` one.

The embedded session is made for streaming barrier stages: enough task slots for every
subtask, no UI, no progress bar, quiet logs, Python workers running this interpreter with
this process's import path (so functions defined in user modules unpickle in the workers),
forked from a daemon that imported streamsnap already (cluster/worker_daemon.py: a restarted
stage's tasks start in a fraction of a second, not seconds).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import sys

from streamsnap.cluster.spark_bridge import bridge_for
from streamsnap.errors import ConfigurationError

log = logging.getLogger(__name__)

EMBEDDED_MIN_SLOTS = 16


def check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return
    if shutil.which("java"):
        return
    raise ConfigurationError(
        "Spark needs a Java runtime (17 or newer), and none was found: no `java` on PATH and no "
        "JAVA_HOME. Install one (e.g. `apt install openjdk-17-jre-headless`) or set JAVA_HOME.")


WORKER_DAEMON = "streamsnap.cluster.worker_daemon"


def embedded_session(min_slots: int, worker_daemon: str = WORKER_DAEMON):
    """The active session if there is one, else a new embedded local session whose Python
    workers fork from `worker_daemon` (`pyspark.daemon`: PySpark's own, without the preload)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # embedded = this machine only
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    existing = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([existing] if existing else []))
    slots = max(EMBEDDED_MIN_SLOTS, min_slots)
    log4j = os.path.join(os.path.dirname(__file__), "log4j2.properties")
    session = (SparkSession.builder.master(f"local[{slots}]").appName("streamsnap")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               # A task that ignores cancellation is killed quickly, so a redeploy gets its slot.
               .config("spark.python.task.killTimeout", "1s")
               # Its workers run this interpreter with this import path: it finds streamsnap.
               .config("spark.python.daemon.module", worker_daemon)
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    # Stop what we started before the interpreter tears down py4j, so Spark does not log
    # rejected task results from a half-stopped scheduler at exit.
    atexit.register(_stop_quietly, session)
    return session


def _stop_quietly(session) -> None:
    try:
        session.stop()
    except Exception as exc:  # at exit the gateway may already be gone; nothing to clean up then
        log.debug("stopping the embedded Spark session at exit failed: %s", exc)


def is_local(spark) -> bool:
    return bridge_for(spark).master.startswith("local")


def available_slots(spark) -> int | None:
    """Task slots a barrier stage can use at once."""
    bridge = bridge_for(spark)
    master = bridge.master
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master)
    if match:
        return (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1))
    if master == "local":
        return 1
    return bridge.default_parallelism()


def require_slots(spark, needed: int, subtasks: int) -> None:
    """The job's barrier stage of `needed` slots (running `subtasks` subtasks) fits the session."""
    slots = available_slots(spark)
    if slots is None:
        log.warning("cannot tell how many task slots the cluster behind the Spark Connect server has (none of "
                    "spark.default.parallelism, spark.cores.max, spark.executor.instances x spark.executor.cores "
                    "is set on the server); this job needs %d. With fewer, Spark waits for more before it fails "
                    "the job", needed)
        return
    if needed > slots:
        master = bridge_for(spark).master
        more = (f"use local[{needed}] or more" if master.startswith("local") else
                f"give the application {needed} or more executor cores (spark.cores.max, or "
                f"spark.executor.instances x spark.executor.cores)")
        raise ConfigurationError(
            f"this job runs {subtasks} subtasks in {needed} task slots of one Spark barrier stage, but "
            f"the Spark session has only {slots} task slots ({master}); {more}, or lower the parallelism")


def control_host(spark) -> str:
    """Address tasks use to reach the JobMaster in this process.

    Classic: the driver's host, as Spark configured it. Spark Connect: this client's address on
    the route to the Connect server (the executors' side of the network, as far as this
    process can tell); the JobMaster moves into the cluster in docs/architecture/deployment-decision.md."""
    if is_local(spark):
        return "127.0.0.1"
    bridge = bridge_for(spark)
    if bridge.kind == "classic":
        return bridge.conf("spark.driver.host")
    return _address_towards(_connect_server_host(spark))


def _connect_server_host(spark) -> str:
    """The Connect server's host, from the client's connection URL (sc://host:port/;...)."""
    builder = getattr(spark.client, "_builder", None)   # PySpark keeps the URL's parts there
    host = getattr(builder, "host", None)
    if not host:
        raise ConfigurationError("cannot tell the Spark Connect server's host from this session; build it "
                                 "with SparkSession.builder.remote('sc://HOST:PORT')")
    return host


def _address_towards(host: str) -> str:
    """This machine's address on the route to `host` (no packet is sent: a UDP connect only
    picks the route)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(host), 9))
        return probe.getsockname()[0]


def align_executor_python(spark) -> str | None:
    """Point a classic session's Python workers at the Python meant for them; what changed, or None.

    PySpark starts its workers with `SparkContext.pythonExec`, fixed when the context is created
    from the PYSPARK_PYTHON environment variable (default `python3`, which may lack pyarrow
    and streamsnap); `spark.pyspark.python` set in the builder is read only by spark-submit.
    Here, for the jobs of this session from now on: `spark.pyspark.python` applies when it is
    set; else, on a local master whose Python was not chosen (no PYSPARK_PYTHON), the workers
    run this driver's interpreter — they run on this machine, and it has what the job needs.
    Spark Connect sessions are the server's business (its own spark.pyspark.python)."""
    from streamsnap.cluster.spark_bridge import is_connect

    if is_connect(spark):
        return None
    sc = spark.sparkContext
    current = getattr(sc, "pythonExec", None)
    configured = sc.getConf().get("spark.pyspark.python", None)
    if configured:
        if configured == current:
            return None
        sc.pythonExec = configured
        change = f"as spark.pyspark.python says, instead of {current!r}"
    elif is_local(spark) and not os.environ.get("PYSPARK_PYTHON") and current != sys.executable:
        sc.pythonExec = sys.executable
        change = (f"this driver's interpreter, instead of {current!r} (no PYSPARK_PYTHON was set); set "
                  f"spark.pyspark.python in the builder to choose another")
    else:
        return None
    note = f"the Python workers of this Spark session start {sc.pythonExec}: {change}"
    log.info(note)
    return note


def executor_python_fix(bridge) -> str:
    """The one setting that chooses the executors' Python for this session (preflight's advice)."""
    if bridge.kind == "connect":
        return ("set spark.pyspark.python on the Spark Connect server (its spark-defaults.conf, or --conf when "
                "starting it): a Connect client cannot choose the Python of the server's executors")
    where = f"e.g. {sys.executable!r}, this driver's" if bridge.master.startswith("local") else \
        "its path on every executor"
    started = os.environ.get("PYSPARK_PYTHON")
    return (f"set spark.pyspark.python to a Python that has them ({where}) in the builder — "
            f"SparkSession.builder.config('spark.pyspark.python', PATH); streamsnap applies it to this "
            f"session's jobs"
            + (f" (it overrides PYSPARK_PYTHON={started!r}, which this session was started with)" if started else ""))

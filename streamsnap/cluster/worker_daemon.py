"""PySpark's Python worker daemon, with streamsnap's heavy modules imported before it forks.

Spark starts one daemon per executor (`python -m <spark.python.daemon.module> pyspark.worker`)
and forks every Python worker from it. A fresh worker then unpickles the job's closure, which
imports numpy, pyarrow(.compute), fsspec and streamsnap's runtime: about a second per worker
alone, several seconds when a failed barrier stage restarts all its tasks at once on a busy
machine — most of a recovery after a slot is killed. Imported here, once, they are inherited
by every fork, and a restarted task starts running its subtasks at once.

    spark.python.daemon.module = streamsnap.cluster.worker_daemon

The embedded session and scripts/spark-connect / scripts/spark-standalone set it; a session
you build yourself can (docs/how-to/cluster.md). It needs streamsnap *installed* in the
executors' Python: Spark runs this module before any task, so a package shipped with
addPyFile/addArtifacts reaches the workers but not the daemon, and a daemon module Python
cannot find fails every Python task of that executor. Where streamsnap sets it, it checked
first that the executors' Python finds it. If something of the preload fails to import, the
daemon says so on stderr (the executor's log) and runs as plain `pyspark.daemon`: a slower
start, never a broken Spark.

Only modules are imported: no thread this module starts, no socket, nothing the forks share.
"""

from __future__ import annotations

import os
import sys
import time

# What a streamsnap task imports, heaviest first: pyspark.worker is what every fork runs; then
# the closure's modules, then what a slot and the JobMaster (forked from task 0) import lazily.
# Optional connectors (Kafka, RocksDB) stay out: a job that uses them imports them.
# pandas: pyarrow imports it (its pandas shim) the first time a source builds a batch from
# Python objects — 0.2-0.3 s of CPU in every restarted subtask otherwise; numpy.random likewise.
PRELOAD = ("numpy", "numpy.random", "pyarrow", "pyarrow.compute", "pandas", "pyarrow.pandas_compat", "fsspec",
           "pyspark.worker", "streamsnap", "streamsnap.runtime.slot", "streamsnap.runtime.slot_supervisor",
           "streamsnap.runtime.task", "streamsnap.network.poller",
           "streamsnap.checkpoint.restore", "streamsnap.cluster.in_cluster", "streamsnap.checkpoint.coordinator")
# Set in the daemon, inherited by its workers: "preloaded in S s" or "not preloaded: why".
MARKER = "STREAMSNAP_WORKER_DAEMON"


def preload(modules: tuple[str, ...] | None = None) -> str:
    """Import `modules` (PRELOAD); a one-line account of it (also left in os.environ[MARKER])."""
    import contextlib
    import importlib

    modules = PRELOAD if modules is None else modules
    started = time.monotonic()
    for name in modules:
        try:
            # The daemon's stdout is Spark's: it reads the daemon's port from it.
            with contextlib.redirect_stdout(sys.stderr):
                importlib.import_module(name)
        except Exception as exc:   # reported, then the plain daemon runs: Spark must keep working
            state = (f"not preloaded: importing {name} failed ({type(exc).__name__}: {exc}); Python workers "
                     f"import it themselves, slower to start")
            print(f"streamsnap worker daemon: {state}", file=sys.stderr, flush=True)
            break
    else:
        state = f"preloaded {len(modules)} modules in {time.monotonic() - started:.2f} s"
    os.environ[MARKER] = state
    return state


def main() -> None:
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()

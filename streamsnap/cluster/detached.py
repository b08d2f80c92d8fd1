"""Detached jobs: submitted from a Spark Connect client that may then exit (`flink run -d`).

A Connect server cancels the executions of a client that went away (minutes later:
docs/architecture/deployment-decision.md, finding 5), so the Spark job of a detached job must belong to a
process that stays: a submitter inside the cluster. The client runs a one-task launcher
query whose task starts that submitter in a session of its own (`python -m
streamsnap.cluster.detached FILE`); the submitter opens its own Connect session to the same
server and runs the job exactly as an attached client would (cluster/submitter.py), with the
JobMaster in task 0 of the job's barrier stage. The client returns once the job's registry
record says RUNNING; from then on anyone who can read the checkpoint directory can list,
attach to, savepoint, stop or cancel the job (api/jobs.py, the CLI).

The job travels to the submitter in the launcher's closure (pickled by Spark, as every
function a job runs) and reaches it as a 0600 file the submitter deletes after reading.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from streamsnap.cluster.registry import TERMINAL
from streamsnap.errors import JobExecutionError

log = logging.getLogger(__name__)

RUNNING_TIMEOUT = 180.0     # seconds the client waits for the detached job to be RUNNING


def connect_url(spark) -> str:
    """The `sc://` connection string of a Connect session (with its token), without its session id."""
    builder = spark.client._builder
    params = {k: v for k, v in getattr(builder, "_params", {}).items() if k != "session_id"}
    return f"sc://{builder.endpoint}/" + "".join(f";{k}={v}" for k, v in params.items())


def launch(spark, job, job_name: str, timeout: float = RUNNING_TIMEOUT):
    """Start `job` (an in_cluster.ClusterJob) under a submitter in the cluster; its RemoteJob once RUNNING."""
    from pyspark import cloudpickle

    from streamsnap.cluster.submitter import RemoteJob, record_submission

    registry = job.registry
    record_submission(registry, job, job_name, "connect", detached=True)
    blob = cloudpickle.dumps((job, job_name, connect_url(spark)))
    rows = (spark.range(0, 1, 1, 1).mapInArrow(_launcher(blob), "pid long, host string, log string")
            .collect())
    pid, host, log_file = rows[0]
    registry.update(submitter={"pid": int(pid), "host": host, "log": log_file})
    remote = RemoteJob(registry, job.deployment.secret)
    deadline = time.monotonic() + timeout
    while True:
        record = registry.read() or {}
        if record.get("status") == "RUNNING":
            return remote
        if record.get("ending") and record.get("status") in TERMINAL:
            error = (record.get("payload") or {}).get("error") or {}
            raise JobExecutionError(f"detached job '{job_name}' ended {record['status']} before it ran: "
                                    f"{error.get('message', 'see the submitter log')} (submitter log: "
                                    f"{log_file} on {host})", job_name=job_name, cause=error.get("cause"),
                                    reason=error.get("reason"))
        if time.monotonic() > deadline:
            raise JobExecutionError(f"detached job '{job_name}' was not RUNNING {timeout:.0f} s after its submitter "
                                    f"started (status {record.get('status')}); see the submitter log {log_file} "
                                    f"on {host}", job_name=job_name, reason="DEPLOY_TIMEOUT")
        time.sleep(0.1)


def _launcher(blob: bytes):
    def run(batches):
        import subprocess
        import tempfile

        import pyarrow as pa

        for _ in batches:
            pass
        fd, path = tempfile.mkstemp(prefix="streamsnap-submitter-", suffix=".job")   # mode 0600
        with os.fdopen(fd, "wb") as out:
            out.write(blob)
        log_file = path[:-len(".job")] + ".log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        with open(log_file, "ab") as out:
            child = subprocess.Popen([sys.executable, "-m", "streamsnap.cluster.detached", path],
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                     cwd=tempfile.gettempdir(), start_new_session=True)
        yield pa.RecordBatch.from_arrays([pa.array([child.pid], pa.int64()), pa.array([_hostname()]),
                                          pa.array([log_file])], names=["pid", "host", "log"])
    return run


def _hostname() -> str:
    import socket

    return socket.gethostname()


def main(path: str) -> int:
    """The detached submitter: run the job in its own Connect session until it ends."""
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    from streamsnap.cluster.submitter import SubmittedJob

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open(path, "rb") as source:
        job, job_name, url = cloudpickle.loads(source.read())
    os.unlink(path)
    spark = SparkSession.builder.remote(url).getOrCreate()
    submitted = SubmittedJob(spark, job, job_name)
    submitted.start(record=False)
    try:
        result = submitted.wait()
        log.info("job '%s' %s", job_name, result.status if result is not None else "ended")
        return 0
    except Exception as exc:   # the job's own failure: recorded in the registry; the log says it too
        log.error("job '%s' ended: %s", job_name, exc)
        return 1


if __name__ == "__main__":
    code = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # The Connect client's cleanup retries against a server that may be gone; do not wait for it.
    os._exit(code)

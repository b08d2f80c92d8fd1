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

Nothing in Spark supervises the submitter, so it holds a lease the job's JobMaster watches
(cluster/submitter_lease.py): when the submitter dies, the JobMaster starts a replacement here
(`replace`), which takes the job over, interrupts the orphaned Spark job in the dead
submitter's Connect session and submits the job again — it resumes from its latest completed
checkpoint without a person.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
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
    # The URL goes with the job, so its JobMaster can start a replacement submitter (`replace`).
    job = dataclasses.replace(job, connect=connect_url(spark))
    record_submission(registry, job, job_name, "connect", detached=True)
    blob = cloudpickle.dumps((job, job_name, job.connect, None))
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
        import pyarrow as pa

        for _ in batches:
            pass
        pid, host, log_file = spawn_submitter(blob)
        yield pa.RecordBatch.from_arrays([pa.array([pid], pa.int64()), pa.array([host]), pa.array([log_file])],
                                         names=["pid", "host", "log"])
    return run


def spawn_submitter(blob: bytes) -> tuple[int, str, str]:
    """Start `python -m streamsnap.cluster.detached FILE` in a session of its own (it outlives
    whatever started it); the job reaches it as a 0600 file. Returns its pid, host and log file."""
    import subprocess
    import tempfile

    fd, path = tempfile.mkstemp(prefix="streamsnap-submitter-", suffix=".job")   # mode 0600
    with os.fdopen(fd, "wb") as out:
        out.write(blob)
    log_file = path[:-len(".job")] + ".log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with open(log_file, "ab") as out:
        child = subprocess.Popen([sys.executable, "-m", "streamsnap.cluster.detached", path],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 cwd=tempfile.gettempdir(), start_new_session=True)
    return child.pid, _hostname(), log_file


def replace(job, job_name: str, lost: dict) -> tuple[int, str, str]:
    """Start a submitter that takes the job over from the lost one (`lost`: its lease)."""
    from pyspark import cloudpickle

    return spawn_submitter(cloudpickle.dumps((job, job_name, job.connect, lost)))


def _hostname() -> str:
    import socket

    return socket.gethostname()


def main(path: str) -> int:
    """The detached submitter: take the job's lease, (as a replacement: stop the orphaned Spark
    job of the lost submitter,) then run the job in its own Connect session until it ends."""
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    from streamsnap.cluster.submitter import SubmittedJob, submission_tag
    from streamsnap.cluster.submitter_lease import SubmitterLease

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open(path, "rb") as source:
        job, job_name, url, lost = cloudpickle.loads(source.read())
    os.unlink(path)
    lease = SubmitterLease(job.registry)
    owner = {"pid": os.getpid(), "host": _hostname()}
    generation = lease.take(owner)         # from now on an older submitter stops (fenced)
    if lost is not None:
        _interrupt_orphan(url, lost, submission_tag(job))
    spark = SparkSession.builder.remote(url).getOrCreate()
    owner["session_id"] = spark.session_id
    # In the lease before any Spark job of this session exists: a replacement must be able to
    # find and interrupt whatever this submitter starts, even if it dies before its first renewal.
    lease.renew(generation, owner)
    threading.Thread(target=_keep_lease, args=(lease, generation, owner), name="submitter-lease",
                     daemon=True).start()
    log.info("job '%s': submitter %d (pid %d)%s", job_name, generation, os.getpid(),
             f", replacing submitter {lost.get('generation')} (pid {lost.get('pid')} on {lost.get('host')})"
             if lost is not None else "")
    submitted = SubmittedJob(spark, job, job_name)
    submitted.start(record=False, follow_logs=False)   # nobody reads this process's log for them
    try:
        result = submitted.wait()
        log.info("job '%s' %s", job_name, result.status if result is not None else "ended")
        return 0
    except Exception as exc:   # the job's own failure: recorded in the registry; the log says it too
        log.error("job '%s' ended: %s", job_name, exc)
        return 1


def _interrupt_orphan(url: str, lost: dict, tag: str) -> None:
    """Join the lost submitter's Connect session by id and interrupt its Spark job (the server
    would cancel it on its own only minutes later); the job then runs under this submitter."""
    from pyspark.sql import SparkSession

    session_id = lost.get("session_id")
    if not session_id:
        log.warning("the lost submitter recorded no Connect session: its Spark job ends when the server "
                    "gives it up")
        return
    orphan = SparkSession.builder.remote(f"{url};session_id={session_id}").create()   # url ends in / or ;k=v
    try:
        interrupted = orphan.interruptTag(tag)
        log.info("interrupted %d operation(s) of the lost submitter's session %s", len(interrupted), session_id)
    finally:
        orphan.client.close()


def _keep_lease(lease, generation: int, owner: dict) -> None:
    from streamsnap.cluster.submitter_lease import RENEW, SupersededSubmitter

    while True:
        time.sleep(RENEW)
        try:
            lease.renew(generation, owner)
        except SupersededSubmitter as exc:
            log.warning("%s: this submitter stops", exc)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)
        except OSError as exc:      # storage hiccup: the next renewal may get through before the timeout
            log.warning("could not renew submitter %d's lease: %s", generation, exc)


if __name__ == "__main__":
    code = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # The Connect client's cleanup retries against a server that may be gone; do not wait for it.
    os._exit(code)

"""Monitoring on the driver: a REST API shaped like Flink's, Prometheus `/metrics` and a web UI
that acts (savepoint, stop, cancel), on by default for every job.

config.py   WebConfig (port, bind address, token), validated at construction
progress.py samples of a running job (status, records per operator and subtask, rates, restarts)
views.py    Flink-shaped JSON from stats values (pure functions)
graph_layout.py where the UI draws the job graph's tasks and edges (pure)
job_summary.py how a job ended (status, records, checkpoints, exceptions), for `streamsnap ui`
archive.py  a checkpoint directory's jobs after the fact (`streamsnap ui DIR`)
discovery.py how `streamsnap ui DIR` finds a running job's endpoint
metrics.py  the Prometheus collector (one registry per job)
auth.py     the bearer-token check
rest.py     the HTTP server and its routes
static/     the web UI (one HTML page, no build step)
terminal.py `streamsnap run`'s live status line and final summary
"""

from streamsnap.web.config import WebConfig

__all__ = ["WebConfig"]

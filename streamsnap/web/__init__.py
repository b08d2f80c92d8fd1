"""Monitoring on the driver: a REST API shaped like Flink's, Prometheus `/metrics` and a web UI.

config.py   WebConfig (port, bind address, token), validated at construction
progress.py samples of a running job (status, records per operator and subtask, rates, restarts)
views.py    Flink-shaped JSON from stats values (pure functions)
metrics.py  the Prometheus collector (one registry per job)
auth.py     the bearer-token check
rest.py     the HTTP server and its routes
static/     the web UI (one HTML page, no build step)
terminal.py `streamsnap run`'s live status line and final summary
"""

from streamsnap.web.config import WebConfig

__all__ = ["WebConfig"]

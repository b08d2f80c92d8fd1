"""How `streamsnap ui DIR` finds a running job's own web endpoint.

The endpoint lives in the job's driver process, on a port chosen at run time, so another process
cannot guess it. While a job with `web=` and checkpointing runs, its endpoint announces itself in
the job's directory of checkpoint storage (`<directory>/<job id>/web.json`: name, id, URL) and
withdraws the file when the job ends. `live_jobs(DIR)` reads those files and keeps the jobs
whose endpoint answers — a driver that was killed leaves a file behind, which is reported as
stale, not as running. The file never holds `WebConfig.token` (a protected endpoint still needs
it); it holds the UI's URL with the token drawn for the job's actions (`rest.WebServer.ui_url`),
so whoever can read the job's directory — who could read its state and secret anyway — can act.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.error
import urllib.request

from streamsnap.checkpoint import filesystem

log = logging.getLogger(__name__)

LIVE_FILE = "web.json"


def announce(directory: str, job_id: str, job_name: str, url: str, ui_url: str | None = None) -> str:
    """Write the live-endpoint file of a job into its directory; returns the file's URL."""
    target = filesystem.join(filesystem.join(filesystem.normalize(directory), job_id), LIVE_FILE)
    record = {"job_id": job_id, "job_name": job_name, "url": url, "host": socket.gethostname(),
              "pid": os.getpid()}
    if ui_url is not None:
        record["ui_url"] = ui_url
    filesystem.write_atomic(target, json.dumps(record).encode())
    return target


def withdraw(file_url: str) -> None:
    """Remove a live-endpoint file (the job ended); already gone is fine."""
    filesystem.delete(file_url)


def _announcements(directory: str) -> list[dict]:
    base = filesystem.normalize(directory)
    fs, path = filesystem.filesystem(base)
    candidates = [f"{path.rstrip('/')}/{LIVE_FILE}"] + sorted(fs.glob(f"{path.rstrip('/')}/*/{LIVE_FILE}"))
    found = []
    for candidate in candidates:
        if not fs.isfile(candidate):
            continue
        try:
            record = json.loads(fs.cat_file(candidate))
            found.append({"job_id": str(record["job_id"]), "job_name": str(record["job_name"]),
                          "url": str(record["url"]), "ui_url": str(record.get("ui_url") or record["url"])})
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{candidate} is not a streamsnap live-endpoint file ({exc}); delete it") from None
    return found


def live_jobs(directory: str, token: str | None = None, timeout: float = 2.0) -> list[dict]:
    """The jobs under `directory` whose web endpoint is announced, each with `live`: whether
    its endpoint answered `GET /jobs` (False: a stale file, e.g. of a killed driver)."""
    out = []
    for job in _announcements(directory):
        request = urllib.request.Request(f"{job['url']}/jobs")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                live = response.status == 200 and job["job_id"] in response.read().decode()
        except urllib.error.HTTPError as exc:
            live = exc.code == 401    # it is there; it wants the token
        except (OSError, ValueError) as exc:
            log.debug("web endpoint of job %s at %s does not answer: %s", job["job_id"], job["url"], exc)
            live = False
        out.append({**job, "live": live})
    return out


__all__ = ["announce", "withdraw", "live_jobs", "LIVE_FILE"]

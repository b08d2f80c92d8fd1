"""The driver's monitoring endpoint: REST routes, the web UI page and Prometheus `/metrics`.

One `WebServer` per job, started with it and closed when it ends (standard-library
ThreadingHTTPServer, one thread per request). It listens from the moment the job is submitted
(`starting`: the job graph, status INITIALIZING "starting Spark") so its URL can be printed
before a cold Spark session is up; `serve` hands it the JobMaster. HTTP threads never touch the JobMaster's state:
they read immutable samples (`web.progress`) and checkpoint stats snapshots, and act only
through the JobMaster's public trigger methods, which post to its own thread and return
futures; a POST answers at once with a request id whose status can be polled, as in Flink.

Actions (POST, PATCH: checkpoint, savepoint, stop-with-savepoint, cancel) always need a bearer
token, also on a loopback endpoint whose reads are open: `WebConfig.token`, or else a token
drawn per job and handed out only in the URL the job prints (`ui_url`, `#token=...`, a
fragment the browser never sends) and the live-endpoint file in the job's directory. A header
token also makes the actions CSRF-safe: another site's page cannot set it.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import secrets
import socket
import threading
import time
import urllib.parse
import uuid
from collections import OrderedDict
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

from streamsnap.errors import ConfigurationError, StreamsnapError
from streamsnap.web import discovery, views
from streamsnap.web.auth import authorized, foreign_request
from streamsnap.web.config import WebConfig, is_loopback
from streamsnap.web.progress import DEFAULT_POLL_INTERVAL, JobProgress, JobSample, vertex_samples

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
MAX_OPERATIONS = 100   # triggered checkpoints/savepoints whose status stays queryable
# The tasks are asked for fresh counters only while someone looked at the endpoint within this
# many seconds: a job nobody watches (most test and batch jobs) pays nothing for its UI.
WATCHED_FOR = 15.0
# How often the serving thread checks for shutdown: the endpoint closes this quickly after its
# job ends (or fails to start), which every job and test waits for.
SHUTDOWN_POLL = 0.02
# After its job ends, an endpoint someone is watching keeps answering until its client has been
# quiet this long (at most ENDED_LINGER_MAX): the UI reads the final state and the status of a
# stop-with-savepoint it is waiting on, then stops polling, instead of finding the port gone.
ENDED_QUIET = 1.5
ENDED_LINGER_MAX = 6.0


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class _Operations:
    """Checkpoints and savepoints triggered over REST, by request id (the newest MAX_OPERATIONS)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._futures: OrderedDict[str, tuple[str, concurrent.futures.Future]] = OrderedDict()

    def add(self, kind: str, future: concurrent.futures.Future) -> str:
        request_id = uuid.uuid4().hex
        with self._lock:
            self._futures[request_id] = (kind, future)
            while len(self._futures) > MAX_OPERATIONS:
                self._futures.popitem(last=False)
        return request_id

    def status(self, kind: str, request_id: str) -> dict:
        with self._lock:
            entry = self._futures.get(request_id)
        if entry is None or entry[0] != kind:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no {kind} was triggered with request id {request_id!r} "
                                                  f"(or it is older than the last {MAX_OPERATIONS})")
        future = entry[1]
        if not future.done():
            return {"status": {"id": "IN_PROGRESS"}}
        error = future.exception()
        if error is not None:
            return {"status": {"id": "COMPLETED"},
                    "operation": {"failure-cause": {"class": type(error).__name__, "stack-trace": str(error)}}}
        result = future.result()
        operation = ({"checkpointId": result.checkpoint_id} if kind == "checkpoint" else {"location": result})
        return {"status": {"id": "COMPLETED"}, "operation": operation}


class StartingJob:
    """A job submitted whose JobMaster does not exist yet (a cold Spark session is starting):
    its graph and status INITIALIZING with what it waits for; actions are refused until it runs."""

    read_only = False

    def __init__(self, job_id: str, name: str, execution_graph, checkpointing: bool, detail: str):
        self.job_id = job_id
        self._name = name
        self._graph = execution_graph.job_graph
        self._checkpointing = checkpointing
        self.detail = detail
        self._start = time.time()

    def sample(self) -> JobSample:
        return JobSample(self.job_id, self._name, "INITIALIZING", self._start, time.time(), 0, (),
                         vertex_samples(self._graph), self._checkpointing, detail=self.detail)

    def checkpoint_stats(self):
        raise self._not_yet("has no checkpoints yet")

    def stats_or_none(self):
        return None

    def checkpoint_config(self) -> dict:
        raise self._not_yet("has no checkpoint configuration to show yet")

    def checkpoints_document(self) -> dict:
        raise self._not_yet("has no checkpoints yet")

    def vertices(self) -> list[tuple[str, str, int]]:
        return [(v.id, v.name, v.parallelism) for v in self._graph.vertices.values()]

    def trigger_checkpoint(self) -> str:
        raise self._not_yet("cannot take a checkpoint yet")

    def trigger_savepoint(self, body: dict, stop: bool = False) -> str:
        raise self._not_yet("cannot take a savepoint yet")

    def cancel(self) -> None:
        raise self._not_yet("cannot be cancelled over REST before it is deployed; interrupt execute() instead")

    def _not_yet(self, what: str) -> HttpError:
        return HttpError(HTTPStatus.CONFLICT, f"job {self.job_id} is INITIALIZING ({self.detail}) and {what}; "
                                              f"try again once it is RUNNING")


class JobEndpoint:
    """What the routes of one job need: its JobMaster (read-only accessors, trigger methods).
    `web.archive.ArchivedJob` answers the same calls for a checkpoint directory."""

    read_only = False

    def __init__(self, master, progress: JobProgress):
        self.master = master
        self.progress = progress
        self.operations = _Operations()

    def sample(self):
        return self.progress.sample()

    def checkpoint_stats(self):
        stats = self.master.checkpoint_stats()
        if stats is None:
            raise HttpError(HTTPStatus.NOT_FOUND, "checkpointing is not enabled for this job; pass "
                                                  "checkpointing=ss.CheckpointConfig(...) to StreamEnvironment")
        return stats

    def stats_or_none(self):
        return self.master.checkpoint_stats()

    def checkpoints_document(self) -> dict:
        return views.checkpoints_overview(self.checkpoint_stats())

    def checkpoint_config(self) -> dict:
        self.checkpoint_stats()   # 404 without checkpointing
        settings = self.master.settings
        return views.checkpoint_config(settings.checkpoint, settings.state_backend)

    def vertices(self) -> list[tuple[str, str, int]]:
        graph = self.master.execution_graph.job_graph
        return [(v.id, v.name, v.parallelism) for v in graph.vertices.values()]

    def trigger_checkpoint(self) -> str:
        self._require_checkpointing("trigger a checkpoint")
        return self.operations.add("checkpoint", self.master.trigger_checkpoint())

    def trigger_savepoint(self, body: dict, stop: bool = False) -> str:
        """A savepoint into body's "target-directory"; `stop` (or "cancel-job": true, as in Flink)
        stops the job once it completed, "drain": true first ends event time (Flink's --drain)."""
        from streamsnap.api.preflight import check_directory

        what = "stop the job with a savepoint" if stop else "take a savepoint"
        self._require_checkpointing(what)
        directory = body.get("target-directory", body.get("targetDirectory"))
        if not isinstance(directory, str) or not directory:
            raise HttpError(HTTPStatus.BAD_REQUEST, f'cannot {what} without a target directory: POST '
                                                    f'{{"target-directory": "<path or fsspec URL>"}}')
        drain = body.get("drain", False)
        if not isinstance(drain, bool):
            raise HttpError(HTTPStatus.BAD_REQUEST, f'"drain" must be true or false, got {drain!r}')
        try:
            check_directory(directory, "the savepoint directory", '"target-directory"')
        except StreamsnapError as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, str(exc)) from exc
        terminate = stop or body.get("cancel-job") is True
        return self.operations.add("savepoint", self.master.trigger_savepoint(directory, terminate=terminate,
                                                                              drain=drain))

    def cancel(self) -> None:
        self.master.cancel()

    def _require_checkpointing(self, what: str) -> None:
        if self.master.settings.checkpoint is None:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"cannot {what}: checkpointing is not enabled for this job; pass "
                                                    f"checkpointing=ss.CheckpointConfig(interval=None, directory=...) "
                                                    f"to StreamEnvironment")


# (method, pattern) → handler name; patterns match the path without its query string.
_ROUTES = [
    ("GET", re.compile(r"^/$"), "index"),
    ("GET", re.compile(r"^/metrics$"), "metrics"),
    ("GET", re.compile(r"^/jobs$"), "jobs"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)$"), "job"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)/checkpoints$"), "checkpoints"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)/exceptions$"), "exceptions"),
    ("PATCH", re.compile(r"^/jobs/(?P<job>[^/]+)$"), "cancel"),
    ("POST", re.compile(r"^/jobs/(?P<job>[^/]+)/stop$"), "post_stop"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)/vertices/(?P<vertex>[^/]+)/backpressure$"), "backpressure"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)/vertices/(?P<vertex>[^/]+)/watermarks$"), "watermarks"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)/checkpoints/config$"), "checkpoint_config"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)/checkpoints/details/(?P<cid>[^/]+)$"), "checkpoint_details"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)/checkpoints/(?P<request>[0-9a-f]{32})$"), "checkpoint_status"),
    ("GET", re.compile(r"^/jobs/(?P<job>[^/]+)/savepoints/(?P<request>[0-9a-f]{32})$"), "savepoint_status"),
    ("POST", re.compile(r"^/jobs/(?P<job>[^/]+)/checkpoints$"), "post_checkpoint"),
    ("POST", re.compile(r"^/jobs/(?P<job>[^/]+)/savepoints$"), "post_savepoint"),
]


class WebServer:
    """Serves one job's monitoring endpoint on the driver until the job ends."""

    def __init__(self, config: WebConfig, poll_interval: float = DEFAULT_POLL_INTERVAL):
        if not isinstance(config, WebConfig):
            raise ConfigurationError(f"web must be an ss.WebConfig, got {type(config).__name__}")
        self.config = config
        self.poll_interval = poll_interval
        self._jobs: dict[str, JobEndpoint] = {}
        handler = type("Handler", (_Handler,), {"server_app": self})
        server_class = ThreadingHTTPServer
        if ":" in config.bind:
            server_class = type("ThreadingHTTPServerV6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        try:
            self._httpd = server_class((config.bind, config.port), handler)
        except OSError as exc:
            raise ConfigurationError(f"the web endpoint cannot listen on {config.bind}:{config.port} ({exc.strerror}); "
                                     f"pick a free port or WebConfig(port=0) for any free one") from exc
        self._httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []
        self._metrics = None   # the prometheus_client registry of the jobs served
        self._announced: str | None = None   # the running job's live-endpoint file (web/discovery.py)
        # What actions need (module docstring): the configured token, else one drawn for this job.
        self.action_token = config.token or secrets.token_urlsafe(24)
        self.read_only = False
        self.ending = False   # the job has ended: answers close their connections (_linger)
        self._last_request = float("-inf")   # time.monotonic() of the latest request (WATCHED_FOR)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def ui_url(self) -> str:
        """The web UI's address to print: with the job's drawn action token in its fragment (never
        sent to the server, so it stays out of access logs and Referer headers)."""
        return f"{self.url}/" if self.config.token else f"{self.url}/#token={self.action_token}"

    def starting(self, job_id: str, name: str, execution_graph, checkpointing: bool,
                 detail: str = "starting Spark") -> None:
        """Serve a submitted job's graph as INITIALIZING (`detail`) until `serve` has its JobMaster."""
        from streamsnap.web.metrics import metrics_registry

        self._jobs[job_id] = starting = StartingJob(job_id, name, execution_graph, checkpointing, detail)
        self._metrics = metrics_registry([starting])
        self._start_serving(job_id)

    def _start_serving(self, job_id: str) -> None:
        if self._threads:
            return
        self._threads = [threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL},
                                          name=f"web-{job_id[:8]}", daemon=True)]
        self._threads[0].start()

    def serve(self, master) -> None:
        """Start serving `master`'s job; the endpoint closes itself when the job has ended."""
        from streamsnap.web.metrics import metrics_registry

        progress = JobProgress(master)
        endpoint = JobEndpoint(master, progress)
        self._jobs[master.job_id] = endpoint
        self._metrics = metrics_registry([endpoint])
        self._start_serving(master.job_id)
        poller = threading.Thread(target=self._poll, args=(endpoint,), name=f"web-poll-{master.job_id[:8]}", daemon=True)
        self._threads.append(poller)
        checkpointing = master.settings.checkpoint
        if checkpointing is not None and checkpointing.directory:
            # `streamsnap ui DIR` finds the running job's endpoint from its checkpoint directory.
            try:
                self._announced = discovery.announce(checkpointing.directory, master.job_id, master.settings.job_name,
                                                     self.url, None if self.config.token else self.ui_url)
            except OSError as exc:
                log.warning("job '%s': its web endpoint could not be announced in %s (%s); `streamsnap ui` "
                            "on that directory will not find it, use %s", master.settings.job_name,
                            checkpointing.directory, exc, self.url)
            else:
                master.on_end(lambda _status: self._withdraw())   # gone before the job's wait() returns
        poller.start()

    def _withdraw(self) -> None:
        announced, self._announced = self._announced, None
        if announced is not None:
            discovery.withdraw(announced)

    def serve_archive(self, jobs) -> None:
        """Serve checkpoint directories' jobs (`web.archive.ArchivedJob`) read-only until `close()`."""
        from streamsnap.web.metrics import metrics_registry

        for job in jobs:
            self._jobs[job.job_id] = job
        self._metrics = metrics_registry(jobs)
        self.read_only = True
        self._threads = [threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL},
                                          name="web-archive", daemon=True)]
        self._threads[0].start()

    def _poll(self, endpoint: JobEndpoint) -> None:
        try:
            while True:
                if time.monotonic() - self._last_request < WATCHED_FOR:
                    endpoint.progress.poll()
                if endpoint.master.wait_terminal(self.poll_interval):
                    break
            self._linger()
        finally:   # also if polling failed: the endpoint never outlives its job
            self._httpd.shutdown()
            self._httpd.server_close()
            self._withdraw()

    def _linger(self) -> None:
        """Keep answering a watched ended job until its client is quiet (ENDED_QUIET)."""
        self.ending = True
        ended = time.monotonic()
        while True:
            now = time.monotonic()
            if now - self._last_request >= ENDED_QUIET or now - ended >= ENDED_LINGER_MAX:
                return
            time.sleep(SHUTDOWN_POLL)

    def close(self) -> None:
        """Stop serving now (a job that failed to start); serving threads end on their own otherwise."""
        if self._threads:
            self._httpd.shutdown()
        self._httpd.server_close()

    # ------------------------------------------------------------------ routes
    def job(self, job_id: str) -> JobEndpoint:
        endpoint = self._jobs.get(job_id)
        if endpoint is None:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no job {job_id!r} here; GET /jobs lists the jobs")
        return endpoint

    def handle(self, method: str, path: str, body: dict | None):
        """(status, content type, bytes) for one authorized request."""
        allowed = set()
        for route_method, pattern, name in _ROUTES:
            match = pattern.match(path)
            if match is None:
                continue
            if route_method != method:
                allowed.add(route_method)
                continue
            return getattr(self, f"_route_{name}")(body=body, **match.groupdict())
        if allowed:
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not allowed on {path}; use {', '.join(sorted(allowed))}")
        raise HttpError(HTTPStatus.NOT_FOUND, f"no such endpoint {path}; see README 'Monitoring' for the routes")

    def _route_index(self, body):
        page = resources.files("streamsnap.web").joinpath("static/index.html").read_bytes()
        return HTTPStatus.OK, "text/html; charset=utf-8", page

    def _route_metrics(self, body):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self._metrics)

    def _route_jobs(self, body):
        return _json(views.jobs_overview(e.sample() for e in self._jobs.values()))

    def _route_job(self, body, job):
        return _json(views.job_details(self.job(job).sample()))

    def _vertex(self, job: str, vertex: str):
        sample = self.job(job).sample()
        found = views.find_vertex(sample, urllib.parse.unquote(vertex))
        if found is None:
            raise HttpError(HTTPStatus.NOT_FOUND, f"job {job} has no vertex {vertex!r}; its vertices are "
                                                  f"{[v.id for v in sample.vertices]} (GET /jobs/{job})")
        return sample, found

    def _route_backpressure(self, body, job, vertex):
        sample, found = self._vertex(job, vertex)
        return _json(views.vertex_backpressure(sample, found))

    def _route_watermarks(self, body, job, vertex):
        return _json(views.vertex_watermarks(self._vertex(job, vertex)[1]))

    def _route_checkpoints(self, body, job):
        return _json(self.job(job).checkpoints_document())

    def _route_checkpoint_config(self, body, job):
        return _json(self.job(job).checkpoint_config())

    def _route_checkpoint_details(self, body, job, cid):
        endpoint = self.job(job)
        if not cid.isdigit():
            raise HttpError(HTTPStatus.BAD_REQUEST, f"a checkpoint id is a number, got {cid!r}")
        stats = endpoint.checkpoint_stats()
        found = next((s for s in stats.history if s.checkpoint_id == int(cid)), None)
        if found is None:
            ids = [s.checkpoint_id for s in stats.history]
            raise HttpError(HTTPStatus.NOT_FOUND, f"checkpoint {cid} is not in the retained history "
                                                  f"(ids {ids or 'none'}); GET .../checkpoints lists it")
        return _json(views.checkpoint_details(found, endpoint.vertices()))

    def _route_exceptions(self, body, job):
        return _json(views.exception_history(self.job(job).sample()))

    def _route_cancel(self, body, job):
        self.job(job).cancel()
        return _json({}, HTTPStatus.ACCEPTED)

    def _route_post_stop(self, body, job):
        return _json({"request-id": self.job(job).trigger_savepoint(body or {}, stop=True)}, HTTPStatus.ACCEPTED)

    def _route_checkpoint_status(self, body, job, request):
        return _json(self.job(job).operations.status("checkpoint", request))

    def _route_savepoint_status(self, body, job, request):
        return _json(self.job(job).operations.status("savepoint", request))

    def _route_post_checkpoint(self, body, job):
        return _json({"request-id": self.job(job).trigger_checkpoint()}, HTTPStatus.ACCEPTED)

    def _route_post_savepoint(self, body, job):
        return _json({"request-id": self.job(job).trigger_savepoint(body or {})}, HTTPStatus.ACCEPTED)


def _json(document, status: HTTPStatus = HTTPStatus.OK):
    return status, "application/json", json.dumps(document).encode()


class _Handler(BaseHTTPRequestHandler):
    server_app: WebServer
    server_version = "streamsnap"
    protocol_version = "HTTP/1.1"
    timeout = 30.0   # an idle keep-alive connection (a browser's) does not hold its thread for ever

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_PATCH(self):
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        app = self.server_app
        try:
            foreign = foreign_request(self.headers.get("Host"), self.headers.get("Origin"),
                                      is_loopback(app.config.bind))
            if foreign is not None:
                raise HttpError(HTTPStatus.FORBIDDEN, foreign)
            app._last_request = time.monotonic()
            if not authorized(self.headers.get("Authorization"), app.config.token):
                raise HttpError(HTTPStatus.UNAUTHORIZED, "this endpoint needs 'Authorization: Bearer <token>' "
                                                         "(the token of the job's WebConfig)")
            if method != "GET" and not app.read_only and not authorized(self.headers.get("Authorization"),
                                                                        app.action_token):
                raise HttpError(HTTPStatus.UNAUTHORIZED, f"{method} acts on the job and needs 'Authorization: Bearer "
                                                         f"<token>': the token after #token= in the URL the job "
                                                         f"printed when it started (or WebConfig.token)")
            body = self._read_body() if method != "GET" else None
            status, content_type, payload = app.handle(method, self.path.split("?", 1)[0], body)
        except HttpError as exc:
            status, content_type = exc.status, "application/json"
            payload = json.dumps({"errors": [str(exc)]}).encode()
        except Exception as exc:  # answer 500 with the reason instead of dropping the connection
            log.exception("web endpoint: %s %s failed", method, self.path)
            status, content_type = HTTPStatus.INTERNAL_SERVER_ERROR, "application/json"
            payload = json.dumps({"errors": [f"internal error: {exc!r}"]}).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="streamsnap"')
        # A refused request's body may be unread; an ended job's endpoint is about to close and
        # must not leave kept-alive connections answering after it: neither connection is reused.
        if status >= 400 or app.ending:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def _read_body(self) -> dict:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            return {}
        if int(length) > MAX_BODY:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(int(length))
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"the request body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object")
        return body

    def log_message(self, format, *args):   # to logging, not stderr
        log.debug("web %s - %s", self.address_string(), format % args)

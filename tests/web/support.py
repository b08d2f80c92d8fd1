"""What the web tests share: a small keyed job with monitoring, and HTTP calls to it."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import urllib.error
import urllib.request

import streamsnap as ss
from tests.integration.support import RunningSum, wait_status

TOKEN = "t0ken-for-the-web-tests-0123456789"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def browser_page(problems: list[str], width: int = 1280):
    """A page in headless Chromium (Debian's, driven by Playwright) that records console errors
    and warnings, page errors and failed requests in `problems`."""
    import pytest

    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}"))
            yield page
        finally:
            browser.close()


def event(i: int) -> dict:
    return {"key": i % 20, "value": 1}


def start_job(spark, tmp_path, web: ss.WebConfig | bool, name: str, state_backend: str = "hashmap"):
    """Generator (2 subtasks, unbounded) → key_by → running sum → Collect, no periodic checkpoints."""
    config = ss.CheckpointConfig(interval=None, directory=str(tmp_path / "ckpt"))
    env = ss.StreamEnvironment(parallelism=2, spark=spark, checkpointing=config, web=web, state_backend=state_backend)
    (env.from_source(ss.sources.Generator(event, rate=500), name="events", uid="events")
        .key_by("key").process(RunningSum(), name="sum", uid="sum")
        .sink_to(ss.sinks.Collect(), name="out", uid="out"))
    client = env.execute_async(name)
    wait_status(client, "RUNNING")
    return client


def call(url: str, method: str = "GET", body: dict | None = None, token: str | None = TOKEN,
         headers: dict | None = None):
    """(status, parsed JSON or text) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    return status, (json.loads(raw) if kind.startswith("application/json") else raw.decode())


def refused(base: str) -> bool:
    """Whether `base` refuses connections (the endpoint has closed), not answers an HTTP error."""
    try:
        urllib.request.urlopen(f"{base}/jobs", timeout=2)
    except OSError as exc:
        return not hasattr(exc, "code")
    return False


def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)

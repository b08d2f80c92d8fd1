"""Control through the job's directory (cluster/storage_control.py): only requests signed with the
job's secret and fresh are answered; answers are signed and bound to their request."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from streamsnap.checkpoint import filesystem
from streamsnap.cluster.storage_control import (UNREADABLE, ListingSchedule, StorageControl, StorageControlError,
                                                fresh, sign, verify)
from streamsnap.cluster.registry import JobRegistry
from streamsnap.errors import StreamsnapError

SECRET = b"s" * 32


def test_a_signature_covers_every_field_and_only_the_secret_makes_it():
    signed = sign(SECRET, {"id": "a", "call": "cancel", "arguments": {}, "at": 10.0})
    assert verify(SECRET, signed) == {"id": "a", "call": "cancel", "arguments": {}, "at": 10.0}
    assert verify(b"x" * 32, signed) is None
    assert verify(SECRET, dict(signed, call="savepoint")) is None
    assert verify(SECRET, {k: v for k, v in signed.items() if k != "mac"}) is None
    assert fresh({"at": 100.0}, now=350.0) and not fresh({"at": 100.0}, now=401.0) and not fresh({}, now=1.0)


def _serve(box: StorageControl, answers: dict, stop: threading.Event) -> None:
    """The JobMaster's side, as cluster/request_files.py runs it: poll for requests, answer each."""
    seen: set[str] = set()
    while not stop.is_set():
        for request in box.poll(seen):
            call = request["call"]
            box.answer(request["id"], {"ok": call in answers, "value": answers.get(call),
                                       "error": None if call in answers else f"unknown request {call!r}"})
        time.sleep(0.02)


def test_a_request_is_answered_through_files_and_forged_or_stale_ones_are_deleted(tmp_path):
    registry = JobRegistry(str(tmp_path), "job-1")
    client, master = StorageControl(registry, SECRET), StorageControl(registry, SECRET)
    stop = threading.Event()
    server = threading.Thread(target=_serve, args=(master, {"describe": {"status": "RUNNING"}}, stop), daemon=True)
    server.start()
    try:
        assert client.call("describe", timeout=10) == {"status": "RUNNING"}
        with pytest.raises(StreamsnapError, match="job job-1: nope failed: unknown request 'nope'"):
            client.call("nope", timeout=10)
        assert os.listdir(client.requests[len("file://"):]) == [] and os.listdir(client.responses[len("file://"):]) == []
    finally:
        stop.set()
        server.join()

    # Written by someone without the secret, or too old: deleted, never answered.
    requests = client.requests[len("file://"):]
    forged = sign(b"x" * 32, {"id": "f1", "call": "cancel", "arguments": {}, "at": time.time()})
    stale = sign(SECRET, {"id": "s1", "call": "cancel", "arguments": {}, "at": time.time() - 3600})
    for body in (forged, stale):
        with open(os.path.join(requests, f"{body['id']}.json"), "w") as out:
            json.dump(body, out)
    assert master.take_requests(set()) == [] and os.listdir(requests) == []


def test_an_unanswered_request_times_out_naming_the_directory_and_a_forged_answer_is_refused(tmp_path):
    registry = JobRegistry(str(tmp_path), "job-2")
    client = StorageControl(registry, SECRET)
    with pytest.raises(TimeoutError, match="no JobMaster answered 'describe' through .*control/requests"):
        client.call("describe", timeout=0.3)
    assert os.listdir(client.requests[len("file://"):]) == []      # the request does not linger

    forger = StorageControl(registry, b"x" * 32)
    stop = threading.Event()
    requests = client.requests[len("file://"):]

    def answer_forged():   # answers every request with the wrong secret
        while not stop.is_set():
            for name in os.listdir(requests) if os.path.isdir(requests) else []:
                if name.endswith(".json") and not name.startswith("."):
                    forger.answer(name[:-5], {"ok": True, "value": "forged"})
            time.sleep(0.02)
    server = threading.Thread(target=answer_forged, daemon=True)
    server.start()
    try:
        with pytest.raises(StorageControlError, match="not authentic"):
            client.call("describe", timeout=10)
    finally:
        stop.set()
        server.join()


def test_the_request_directory_is_listed_only_when_the_pending_marker_changed():
    schedule = ListingSchedule(full_listing=30.0)
    assert schedule.should_list(None, now=0.0)            # the first look lists (requests from a failover)
    schedule.listed(None, now=0.0)
    assert not schedule.should_list(None, now=1.0)        # nothing written since: no LIST
    assert schedule.should_list("r1", now=2.0)            # a client wrote a request, then the marker
    assert schedule.should_list("r1", now=3.0)            # that listing failed (not recorded): list again
    schedule.listed("r1", now=3.0)
    assert not schedule.should_list("r1", now=4.0)
    assert schedule.should_list(UNREADABLE, now=5.0)      # the marker could not be read: list to be sure
    assert not schedule.should_list("r1", now=32.9)
    assert schedule.should_list("r1", now=33.0)           # every full_listing seconds regardless (stale requests)


def test_a_poll_lists_the_requests_when_the_marker_changed_and_a_client_s_call_changes_it(tmp_path):
    registry = JobRegistry(str(tmp_path), "job-3")
    master = StorageControl(registry, SECRET)
    seen: set[str] = set()
    assert master.poll(seen) == []
    # A request file without its marker (a client that died between the two writes): not
    # listed by the next looks, only by the periodic full listing.
    body = sign(SECRET, {"id": "r1", "call": "describe", "arguments": {}, "at": time.time()})
    filesystem.write_atomic(filesystem.join(master.requests, "r1.json"), json.dumps(body).encode())
    assert master.poll(seen) == [] and master.take_requests(set()) != []
    filesystem.write_atomic(master.pending, b"r1")
    assert [r["id"] for r in master.poll(seen)] == ["r1"] and master.poll(seen) == []
    # A client's call writes its request, then the marker: the next look lists and answers it.
    stop = threading.Event()
    server = threading.Thread(target=_serve, args=(master, {"describe": "ok"}, stop), daemon=True)
    server.start()
    try:
        assert StorageControl(registry, SECRET).call("describe", timeout=30) == "ok"
    finally:
        stop.set()
        server.join()

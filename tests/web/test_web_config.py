"""WebConfig is validated at construction; the endpoint refuses what it must."""

from __future__ import annotations

import socket

import pytest

import streamsnap as ss
from streamsnap.web.auth import authorized, foreign_request
from streamsnap.web.rest import WebServer

TOKEN = "a-token-of-enough-length-42"


@pytest.mark.parametrize("kwargs, message", [
    ({"port": -1}, "WebConfig.port must be an integer in 0..65535"),
    ({"port": 70000}, "WebConfig.port must be an integer in 0..65535"),
    ({"port": "8081"}, "WebConfig.port must be an integer"),
    ({"port": True}, "WebConfig.port must be an integer"),
    ({"bind": ""}, "WebConfig.bind must be an IP address or host name"),
    ({"bind": "no such host!"}, "neither an IP address nor a host name"),
    ({"bind": "0.0.0.0"}, "pass token=secrets.token_urlsafe(32) or bind to '127.0.0.1'"),
    ({"bind": "example.org"}, "without authentication"),
    ({"bind": "::"}, "without authentication"),
    ({"token": "short"}, "at least 16 characters"),
    ({"token": 12345678901234567}, "at least 16 characters"),
    ({"token": "with a space inside it"}, "no whitespace"),
])
def test_bad_web_config_is_refused_naming_the_fix(kwargs, message):
    with pytest.raises(ss.ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ss.WebConfig(**kwargs)


def test_good_web_configs_and_the_token_stays_out_of_repr():
    assert ss.WebConfig().bind == "127.0.0.1" and ss.WebConfig().port == 0
    ss.WebConfig(bind="localhost")
    ss.WebConfig(bind="::1", port=8081)
    config = ss.WebConfig(bind="0.0.0.0", token=TOKEN)
    assert TOKEN not in repr(config)


def test_stream_environment_checks_its_web_argument():
    with pytest.raises(ss.ConfigurationError, match=r"StreamEnvironment.web must be True .* False \(none\) or an ss.WebConfig"):
        ss.StreamEnvironment(web={"port": 8081})


def test_a_taken_port_fails_before_the_job_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ss.ConfigurationError, match=rf"cannot listen on 127.0.0.1:{port}.*WebConfig\(port=0\)"):
            WebServer(ss.WebConfig(port=port))


def test_bearer_token_check():
    assert authorized(None, None) and authorized("anything", None)
    assert authorized(f"Bearer {TOKEN}", TOKEN)
    assert not authorized(None, TOKEN)
    assert not authorized(TOKEN, TOKEN)
    assert not authorized(f"Bearer {TOKEN}x", TOKEN)
    assert not authorized(f"bearer {TOKEN}", TOKEN)
    assert not authorized("Bearer \udcff", TOKEN)


@pytest.mark.parametrize("host, origin, loopback_only, refused", [
    ("127.0.0.1:8081", None, True, None),
    ("localhost:8081", "http://localhost:8081", True, None),       # the UI's own POST
    ("[::1]:8081", None, True, None),
    ("evil.example:8081", None, True, "DNS-rebinding guard"),
    ("127.0.0.1:8081", "https://evil.example", True, "cross-origin request"),
    ("127.0.0.1:8081", "null", True, "opaque origin"),
    ("node7:8081", None, False, None),                               # bound elsewhere: the token decides
    ("node7:8081", "http://other:80", False, "cross-origin request"),
])
def test_requests_from_other_sites_are_refused(host, origin, loopback_only, refused):
    reason = foreign_request(host, origin, loopback_only)
    assert (reason is None) if refused is None else (refused in reason)

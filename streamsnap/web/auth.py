"""Who may call the monitoring endpoint: the bearer token, and browser-borne requests refused.

The token comparison takes the same time whatever prefix of the token a caller guessed right
(hmac.compare_digest), so the token cannot be recovered byte by byte from response times.

A loopback endpoint without a token is still reachable by any web page the user has open:
the page can send a POST (a "simple" cross-origin request needs no CORS consent; only the
response is hidden from it), and with DNS rebinding it can even read responses under its own
host name. So a request whose Origin is another site is refused, and a loopback endpoint only
answers requests addressed to a loopback host name (Host header).
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from streamsnap.web.config import is_loopback


def authorized(header: str | None, token: str | None) -> bool:
    """Whether a request with this Authorization header may proceed (always, without a token)."""
    if token is None:
        return True
    if header is None:
        return False
    return hmac.compare_digest(header.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode("utf-8"))


def _host_name(host: str) -> str:
    return urlsplit(f"//{host}").hostname or ""


def foreign_request(host: str | None, origin: str | None, loopback_only: bool) -> str | None:
    """Why a request must be refused as coming from another site (None: it may proceed).

    host, origin: the request's Host and Origin headers; loopback_only: the endpoint listens on
    a loopback address.
    """
    if loopback_only and host is not None and not is_loopback(_host_name(host)):
        return (f"Host {host!r} is not a loopback name; this endpoint answers requests to 127.0.0.1 or "
                f"localhost only (a DNS-rebinding guard)")
    if origin is not None and origin != "null" and urlsplit(origin).netloc != (host or ""):
        return f"cross-origin request from {origin!r} refused; open the UI from this endpoint itself"
    if origin == "null":
        return "requests from an opaque origin (a sandboxed page or a file) are refused"
    return None

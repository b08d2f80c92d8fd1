"""WebConfig: where the driver serves its monitoring endpoint, validated at construction.

The endpoint can trigger checkpoints and savepoints, so it listens on the loopback interface
unless told otherwise, and anywhere else only behind a bearer token: a non-loopback binding
without a token is refused here, before a job starts, not discovered later in production.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from streamsnap.errors import ConfigurationError

MIN_TOKEN_LENGTH = 16
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class WebConfig:
    """The driver's REST API, Prometheus `/metrics` and web UI (see the docs' How-to › Monitoring page).

    port: TCP port; 0 picks a free one (read it from `JobClient.web_url`), Flink's is 8081.
    bind: the address to listen on; "127.0.0.1" (the default) is reachable from this machine
      only. Any other address ("0.0.0.0", a host's IP or name) needs `token`.
    token: a shared secret of at least 16 characters; when set, every request must carry
      `Authorization: Bearer <token>` and gets 401 otherwise.
    """

    port: int = 0
    bind: str = "127.0.0.1"
    token: str | None = None

    def __post_init__(self):
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigurationError(f"WebConfig.port must be an integer in 0..65535 (0 picks a free port), "
                                     f"got {self.port!r}")
        if not isinstance(self.bind, str) or not self.bind:
            raise ConfigurationError(f"WebConfig.bind must be an IP address or host name such as '127.0.0.1', "
                                     f"got {self.bind!r}")
        try:
            ipaddress.ip_address(self.bind)
        except ValueError:
            if not _HOSTNAME.match(self.bind):
                raise ConfigurationError(f"WebConfig.bind {self.bind!r} is neither an IP address nor a host name; "
                                         f"use '127.0.0.1' (this machine only) or '0.0.0.0' with a token") from None
        if self.token is not None:
            if not isinstance(self.token, str) or len(self.token) < MIN_TOKEN_LENGTH:
                raise ConfigurationError(
                    f"WebConfig.token must be a string of at least {MIN_TOKEN_LENGTH} characters, e.g. "
                    f"secrets.token_urlsafe(32); got {'a shorter string' if isinstance(self.token, str) else repr(self.token)}")
            if not self.token.isprintable() or any(c.isspace() for c in self.token):
                raise ConfigurationError("WebConfig.token must be printable and contain no whitespace "
                                         "(it travels in an HTTP header); e.g. secrets.token_urlsafe(32)")
        elif not is_loopback(self.bind):
            raise ConfigurationError(
                f"WebConfig(bind={self.bind!r}) exposes the job's REST API (which can trigger savepoints) beyond "
                f"this machine without authentication; pass token=secrets.token_urlsafe(32) or bind to '127.0.0.1'")

    def __repr__(self) -> str:   # never print the secret
        return f"WebConfig(port={self.port}, bind={self.bind!r}, token={'***' if self.token else None})"

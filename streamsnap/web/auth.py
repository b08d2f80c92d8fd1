"""Bearer-token check for the monitoring endpoint.

The comparison takes the same time whatever prefix of the token a caller guessed right
(hmac.compare_digest), so the token cannot be recovered byte by byte from response times.
"""

from __future__ import annotations

import hmac


def authorized(header: str | None, token: str | None) -> bool:
    """Whether a request with this Authorization header may proceed (always, without a token)."""
    if token is None:
        return True
    if header is None:
        return False
    return hmac.compare_digest(header.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode("utf-8"))

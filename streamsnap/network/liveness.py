"""Noticing a silent peer: a host that vanished or a network that dropped its packets, where no
FIN or RST ever arrives and a blocked `recv()` would wait forever.

Every data and control connection asks the kernel to watch its peer (Linux TCP keepalive and
TCP_USER_TIMEOUT, as Flink's Netty connections and Kafka clients do): after `idle` seconds
without traffic the kernel probes the peer every `interval` seconds and gives the connection up
after `count` unanswered probes; data sent and not acknowledged for `user_timeout` seconds gives
it up too. Either way the socket fails with ETIMEDOUT, and the task (a lost channel) or the
JobMaster (a lost subtask) fails over as on a closed connection. The kernel answers probes even
while this process's Python thread is busy in a user function, so a slow operator is never
mistaken for a lost host — the reason this is not an application heartbeat.

`ProbePlan` is the decision (pure, tested probe by probe): which settings give a peer at most
`peer_timeout` seconds of silence. `arm` applies it to a socket.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass

PROBES = 3                  # unanswered keepalive probes before the peer is declared lost
MIN_PEER_TIMEOUT = 2.0      # 1 s of idleness, then 1 s probes: the kernel counts whole seconds


@dataclass(frozen=True)
class ProbePlan:
    """Kernel liveness settings for one connection, and what they imply.

    idle: seconds of silence before the first probe; interval: seconds between probes; count:
    unanswered probes that end the connection; user_timeout: seconds sent data may stay
    unacknowledged."""

    idle: int
    interval: int
    count: int
    user_timeout: float

    @classmethod
    def for_timeout(cls, peer_timeout: float) -> "ProbePlan":
        """The plan that notices a silent peer within `peer_timeout` seconds (whole seconds for
        the probes, as the kernel counts them; never later than asked)."""
        if not peer_timeout >= MIN_PEER_TIMEOUT:
            raise ValueError(f"peer_timeout must be at least {MIN_PEER_TIMEOUT:g} s, got {peer_timeout!r}")
        budget = math.floor(peer_timeout)
        count = min(PROBES, budget - 1)
        interval = max(1, (budget - budget // 2) // count)
        idle = max(1, budget - interval * count)
        return cls(idle=idle, interval=interval, count=count, user_timeout=float(peer_timeout))

    @property
    def bound(self) -> float:
        """The longest a silent peer goes unnoticed: idle, then every probe unanswered."""
        return self.idle + self.interval * self.count

    def lost(self, silent_for: float, unacknowledged_for: float | None = None) -> bool:
        """Whether the kernel has given the connection up: silent (no byte, no probe answer) for
        `silent_for` seconds, and the oldest sent byte unacknowledged for `unacknowledged_for`
        seconds (None: nothing outstanding)."""
        if unacknowledged_for is not None and unacknowledged_for >= self.user_timeout:
            return True
        return silent_for >= self.bound

    def probes_sent(self, silent_for: float) -> int:
        """Keepalive probes the kernel has sent after `silent_for` seconds of silence."""
        if silent_for < self.idle:
            return 0
        return min(self.count, int((silent_for - self.idle) // self.interval) + 1)


def arm(sock: socket.socket, peer_timeout: float | None) -> None:
    """Have the kernel end `sock` once its peer is silent for `peer_timeout` seconds (None: off,
    the kernel's defaults of hours). Options the platform lacks are skipped: Linux has all."""
    if peer_timeout is None:
        return
    plan = ProbePlan.for_timeout(peer_timeout)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", plan.idle), ("TCP_KEEPINTVL", plan.interval),
                        ("TCP_KEEPCNT", plan.count), ("TCP_USER_TIMEOUT", int(plan.user_timeout * 1000))):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)

"""Which address a task is known by, and which address its connections leave from.

Spark names an executor by the host its Worker advertises (`--host`, SPARK_LOCAL_IP or
SPARK_LOCAL_HOSTNAME); peers must reach a task's data and control ports there, never at
`socket.gethostname()` (which often resolves to loopback) nor at whatever address a connection
happened to arrive from. On one machine posing as several hosts (loopback aliases 127.0.0.2,
127.0.0.3, ... — scripts/spark-standalone --hosts) the kernel would send every connection from
127.0.0.1; binding it to the task's own alias makes its traffic that host's, so a packet filter
between two "hosts" (scripts/partition) cuts exactly their connections.
"""

from __future__ import annotations

import ipaddress
import os

# Spark's own order (Utils.localHostName): an explicit host name, then an explicit address.
_HOST_ENV = ("SPARK_LOCAL_HOSTNAME", "SPARK_LOCAL_IP")


def advertised_host(spark_address: str) -> str:
    """The host this executor advertises: the one its environment states, as Spark reads it, else
    `spark_address` (the address the driver saw the executor connect from)."""
    for name in _HOST_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return spark_address


def source_address(host: str | None) -> str | None:
    """The local address outgoing connections of a task on `host` are bound to: `host` itself
    when it is a loopback alias other than 127.0.0.1 (one machine posing as several hosts),
    else None (the kernel's choice, right on a real host)."""
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return None         # a host name: a real host, whose routes pick the source
    if address.is_loopback and address.version == 4 and str(address) != "127.0.0.1":
        return str(address)
    return None

"""What the Kafka source and sink ask the cluster about: is it there, which topics and partitions.

Why it exists: both connectors check before the job runs (preflight) that the bootstrap servers
answer and that their topics exist, and the source lists partitions (its splits) at start and
again to discover new ones. One place for the metadata calls and for errors that name the
servers and topics.
"""

from __future__ import annotations

import re

from streamsnap.errors import PreflightError


def require_client(what: str) -> None:
    """PreflightError when confluent-kafka (the Kafka client library) is not installed."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError as exc:
        raise PreflightError(f"{what} needs the confluent-kafka package, which is not installed ({exc}). "
                             f"Fix: pip install 'streamsnap[kafka]' (on a cluster: into the executors' "
                             f"Python too)") from exc


def _admin(bootstrap: str, config: dict | None = None):
    from confluent_kafka.admin import AdminClient

    settings = {"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 5000}
    settings.update({k: v for k, v in (config or {}).items() if not k.startswith(("transaction", "enable.",
                                                                                   "isolation", "group."))})
    return AdminClient(settings)


def cluster_topics(bootstrap: str, timeout: float, config: dict | None = None, what: str = "Kafka") -> dict:
    """{topic: number of partitions} of the cluster; PreflightError naming the servers if none answers."""
    require_client(what)
    from confluent_kafka import KafkaException

    try:
        metadata = _admin(bootstrap, config).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise PreflightError(
            f"{what}: the Kafka bootstrap servers {bootstrap!r} did not answer within {timeout:g} s "
            f"({exc.args[0].str() if exc.args and hasattr(exc.args[0], 'str') else exc}). Fix: start the broker, "
            f"or correct bootstrap= (host:port of a reachable broker)") from exc
    return {name: len(t.partitions) for name, t in metadata.topics.items() if not t.error}


def require_topics(bootstrap: str, topics: list[str], timeout: float, config: dict | None = None,
                   what: str = "Kafka") -> dict:
    """{topic: partitions} for `topics`; PreflightError naming any that do not exist."""
    known = cluster_topics(bootstrap, timeout, config, what)
    missing = [t for t in topics if t not in known or known[t] == 0]
    if missing:
        raise PreflightError(
            f"{what}: topic(s) {', '.join(repr(t) for t in missing)} do not exist on {bootstrap!r} "
            f"(it has {len(known)} topic(s){': ' + ', '.join(sorted(known)[:10]) if known else ''}). Fix: create "
            f"them (kafka-topics --create, or AdminClient.create_topics) or correct the topic name")
    return {t: known[t] for t in topics}


def matching_topics(known: dict, topics: list[str] | None, pattern: str | None) -> list[str]:
    """The topics a source reads: the named ones, or those matching `pattern` (internal ones excluded)."""
    if topics is not None:
        return [t for t in topics if t in known]
    regex = re.compile(pattern)
    return sorted(t for t in known if regex.fullmatch(t) and not t.startswith("__"))


def partitions(bootstrap: str, topics: list[str] | None, pattern: str | None, timeout: float,
               config: dict | None = None) -> list[tuple[str, int]]:
    """Every (topic, partition) the source reads, sorted."""
    known = cluster_topics(bootstrap, timeout, config, "Kafka source")
    return sorted((t, p) for t in matching_topics(known, topics, pattern) for p in range(known[t]))


def security_settings(config: dict | None) -> list[str]:
    """The config= keys a connection of streamsnap's own (plaintext Kafka) cannot honour."""
    return sorted(k for k, v in (config or {}).items() if k.startswith(("sasl.", "ssl.")) or (
        k == "security.protocol" and str(v).lower() != "plaintext"))


__all__ = ["security_settings", "require_client", "cluster_topics", "require_topics", "matching_topics", "partitions"]

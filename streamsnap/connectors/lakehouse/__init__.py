"""Lakehouse tables: Delta Lake and Apache Iceberg, written exactly-once.

A sink here writes data files from every subtask and makes them visible with one table commit
per completed checkpoint, by a single global committer on the JobMaster (`committer.py`).
The table libraries (`deltalake`, `pyiceberg`) are the optional extra `streamsnap[lakehouse]`;
they are imported when a sink is created, so `ss.sinks` loads without them.
"""

from __future__ import annotations

from streamsnap.connectors.lakehouse.delta_sink import Delta
from streamsnap.connectors.lakehouse.iceberg_sink import Iceberg

__all__ = ["Delta", "Iceberg"]

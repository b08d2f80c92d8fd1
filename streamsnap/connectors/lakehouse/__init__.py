"""Lakehouse tables: Delta Lake and Apache Iceberg as sources and exactly-once sinks.

A sink here writes data files from every subtask and makes them visible with one table commit
per completed checkpoint, by a single global committer on the JobMaster (`committer.py`). A
source reads a table's data files as splits and, when continuous, follows its new versions or
snapshots (`enumeration.py`). The table libraries (`deltalake`, `pyiceberg`) are the optional
extra `streamsnap[lakehouse]`; they are imported when a source or sink is created, so `ss.sinks`
and `ss.sources` load without them.

The public names are `ss.sinks.Delta`/`ss.sinks.Iceberg` (`delta_sink.py`, `iceberg_sink.py`) and
`ss.sources.Delta`/`ss.sources.Iceberg` (`delta_source.py`, `iceberg_source.py`).
"""

"""Lakehouse tables (Delta Lake, Apache Iceberg) as sources and sinks of streamsnap jobs."""

"""FileSink: exactly-once part files with Flink's rolling policies (`sink.py`, `rolling.py`,
`compaction.py`). `ss.sinks.FileSink` and `ss.sinks.RollingPolicy` are these."""

from streamsnap.connectors.filesink.rolling import RollingPolicy
from streamsnap.connectors.filesink.sink import FileSink, FileSinkWriter

__all__ = ["FileSink", "FileSinkWriter", "RollingPolicy"]

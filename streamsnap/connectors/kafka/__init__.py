"""The Kafka connector: `ss.sources.Kafka` and `ss.sinks.Kafka` and what they are made of.

* `source.py` — the source (`KafkaSource`, `ss.sources.Kafka`): partitions as splits, offsets
  as split state; its columnar fetcher is `fetcher.py` (sockets, one request in flight per
  broker) over `fetch.py` (Fetch requests and record batches decoded into columns, no I/O).
* `sink.py` — the sink (`KafkaSink`, `ss.sinks.Kafka`): one Kafka transaction per checkpoint for
  exactly-once; the transactional-id pool and its recovery plan are `transactions.py`, the
  columnar producer `producer.py` (sockets) over `produce.py` (record batches encoded from the
  columns, no I/O).
* `protocol.py` — the Kafka wire protocol both sides share (framing, EndTxn).
* `admin.py` — topic checks and security settings before a job runs.
* `avro.py`, `avro_columns.py` — format="avro": Avro records ↔ Arrow columns.
"""

from streamsnap.connectors.kafka.sink import Kafka as KafkaSink
from streamsnap.connectors.kafka.source import Kafka as KafkaSource

__all__ = ["KafkaSink", "KafkaSource"]

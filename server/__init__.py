"""``txlake serve``: the engine as a single-node Kafka-compatible broker.

:mod:`.codec` (frames and message codecs), :mod:`.network` (connections, ordering,
defences), :mod:`.serve` (start-up, shutdown on SIGTERM/SIGINT). Nothing here knows a
Kafka semantic: requests go to :class:`txlake.engine.apis.KafkaApis`.
"""

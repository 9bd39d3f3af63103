"""The engine: partition logs, producer state and the embedded broker.

Modules: :mod:`.apis` (Kafka's KafkaApis: one handler per ApiKey), :mod:`.broker` (request
handlers named after Kafka's APIs over the partition logs and coordinators),
:mod:`.partition_log` (one partition's log end offset, producer state and append validation,
Kafka's UnifiedLog), :mod:`.partition_writer` (what the coordinators and compaction use of the
broker, Kafka's PartitionWriter), :mod:`.group_commit` (one object + one catalog commit per
flush), :mod:`.producer_state` (Kafka's ProducerStateManager), :mod:`.log_loader`
(producer-state recovery), :mod:`.log_reader` (reading committed segments),
:mod:`.partitioner` (murmur2), :mod:`.orphans`, :mod:`.registry` (one broker per storage root
per process), :mod:`.requests`, :mod:`.errors` (Kafka's error codes).
"""

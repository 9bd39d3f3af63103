"""The engine: partition logs, producer state and the embedded broker.

Modules: :mod:`.broker` (request handlers named after Kafka's APIs), :mod:`.group_commit`
(one object + one catalog commit per flush), :mod:`.producer_state` (Kafka's
ProducerStateManager), :mod:`.log_loader` (producer-state recovery), :mod:`.log_reader`
(reading committed segments), :mod:`.partitioner` (murmur2), :mod:`.orphans`,
:mod:`.registry` (one broker per storage root per process), :mod:`.requests`,
:mod:`.errors` (Kafka's error codes).
"""

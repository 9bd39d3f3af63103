"""The event-sourced catalog: storage (fsspec + create-if-absent), the commit log and
its checkpoints, topics and their configs, segments and offsets, the writer lease.

Modules: :mod:`.storage`, :mod:`.catalog`, :mod:`.state`, :mod:`.writer_lease`,
:mod:`.topic_names`, :mod:`.topic_config`, :mod:`.errors`. Nothing here knows producer
state or transactions.
"""

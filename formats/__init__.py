"""Arrow schemas and Parquet codecs for every object txlake persists.

The bottom layer: it knows byte layouts and format versions, nothing about topics,
leases or transactions. Modules: :mod:`.records` (record segments),
:mod:`.catalog_actions` (catalog commits and checkpoints), :mod:`.producer_state`
(producer-state snapshots), :mod:`.versioning` (format tags), :mod:`.errors`.
"""

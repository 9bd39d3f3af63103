"""group_apis (being built)."""

APIS: list = []

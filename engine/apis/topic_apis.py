"""topic_apis (being built)."""

APIS: list = []

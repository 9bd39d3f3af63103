"""log_apis (being built)."""

APIS: list = []

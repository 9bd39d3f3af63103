"""The calls confluent-kafka's Producer and Consumer share through their librdkafka handle and
that mean the same for both here: ``cluster_id()`` and ``set_sasl_credentials()``."""

from __future__ import annotations


class HandleCalls:
    """A mixin for :class:`~txlake.Producer` and :class:`~txlake.Consumer`; they provide
    ``_broker`` (the storage root's engine) and ``_check_open(message)``."""

    def cluster_id(self, timeout: float = -1) -> str:
        """The storage root's cluster id (see :meth:`txlake.AdminClient.cluster_id`); ``timeout``
        (s) is accepted for confluent-kafka's signature.

        Raises:
            RuntimeError: ``"Handle has been closed"`` after ``close()``.
        """
        from .admin import cluster_id_of

        self._check_open("Handle has been closed")
        return cluster_id_of(self._broker)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """Accepted with no effect, as ``security.protocol`` and ``sasl.*`` (docs/confluent-kafka.md).

        Raises:
            TypeError: ``username`` or ``password`` is not a str.
            RuntimeError: ``"Handle has been closed"`` after ``close()``.
        """
        from .admin import check_sasl_credentials

        self._check_open("Handle has been closed")
        check_sasl_credentials(username, password)

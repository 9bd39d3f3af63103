"""Kafka's error codes (``org.apache.kafka.common.protocol.Errors``) and the engine's API error.

Request handlers answer with these codes, exactly as a Kafka broker would, so the
future wire-protocol server is a thin layer. Client-local codes (negative, with a
leading underscore) are librdkafka's, as confluent-kafka exposes them.
"""

from __future__ import annotations

from enum import IntEnum

from txlake.formats.errors import TxlakeError


class Errors(IntEnum):
    """Kafka's broker error codes (name = Kafka's name) and librdkafka's local codes."""

    # librdkafka client-local codes
    _BAD_MSG = -199
    _FAIL = -196
    _MSG_TIMED_OUT = -192
    _PARTITION_EOF = -191
    _UNKNOWN_PARTITION = -190
    _UNKNOWN_TOPIC = -188
    _INVALID_ARG = -186
    _TIMED_OUT = -185
    _QUEUE_FULL = -184
    _CONFLICT = -173
    _STATE = -172
    _NOT_IMPLEMENTED = -170
    _NO_OFFSET = -168
    _OUTDATED = -167
    _INVALID_TYPE = -154
    _PURGE_QUEUE = -152
    _PURGE_INFLIGHT = -151
    _FATAL = -150
    _INCONSISTENT = -149
    _MAX_POLL_EXCEEDED = -147
    _FENCED = -144
    _NOT_CONFIGURED = -145
    _AUTO_OFFSET_RESET = -140
    # Kafka broker codes
    UNKNOWN_SERVER_ERROR = -1
    NO_ERROR = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PART = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    UNKNOWN_PRODUCER_ID = 59
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELECTION_NOT_NEEDED = 84
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    UNKNOWN_TOPIC_ID = 100
    TRANSACTIONAL_ID_NOT_FOUND = 105
    TRANSACTION_ABORTABLE = 120
    INVALID_REGULAR_EXPRESSION = 128

    @property
    def retriable(self) -> bool:
        """Whether Kafka marks the error retriable (``RetriableException`` subclasses)."""
        return self in _RETRIABLE


_RETRIABLE = frozenset({
    Errors.CORRUPT_MESSAGE, Errors.UNKNOWN_TOPIC_OR_PART, Errors.LEADER_NOT_AVAILABLE,
    Errors.NOT_LEADER_OR_FOLLOWER, Errors.REQUEST_TIMED_OUT, Errors.NETWORK_EXCEPTION,
    Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR,
    Errors.CONCURRENT_TRANSACTIONS, Errors.KAFKA_STORAGE_ERROR, Errors.UNSTABLE_OFFSET_COMMIT,
    Errors.REBALANCE_IN_PROGRESS, Errors.FENCED_LEADER_EPOCH, Errors.UNKNOWN_LEADER_EPOCH, Errors._TIMED_OUT, Errors._MSG_TIMED_OUT,
})


class ApiError(TxlakeError):
    """A request failed with a Kafka error code (what a broker would put in its response).

    Attributes:
        error: the :class:`Errors` code.
    """

    def __init__(self, error: Errors, message: str = ""):
        super().__init__(message or error.name)
        self.error = error
        self.message = message or error.name

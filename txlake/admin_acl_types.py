"""The ACL and SCRAM types of the AdminClient, named and shaped as confluent-kafka's
(``confluent_kafka.admin``: ``AclOperation``, ``AclPermissionType``, ``ResourcePatternType``,
``AclBinding``, ``AclBindingFilter``, ``ScramMechanism``, ``ScramCredentialInfo``,
``UserScramCredentialsDescription``, ``UserScramCredentialAlteration``,
``UserScramCredentialUpsertion``, ``UserScramCredentialDeletion``). Enum values are librdkafka's,
which are Kafka's ids on the wire.

txlake has no authorizer and no SASL (docs/server.md): these types exist so confluent-kafka code
runs unchanged; the calls answer what Kafka answers without an authorizer (SECURITY_DISABLED).
"""

from __future__ import annotations

import functools
from typing import Any

from .admin_group_types import _enum, _Ordered
from .admin_types import ResourceType


class AclOperation(_Ordered):
    """An ACL operation (confluent-kafka's ``AclOperation``; Kafka's ``AclOperation`` ids)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermissionType(_Ordered):
    """An ACL permission type (confluent-kafka's ``AclPermissionType``; Kafka's ids)."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class ResourcePatternType(_Ordered):
    """How an ACL's resource name matches (confluent-kafka's ``ResourcePatternType``; Kafka's ``PatternType`` ids)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


@functools.total_ordering
class AclBinding:
    """An ACL: a principal's permission for an operation on resources (confluent-kafka's ``AclBinding``).

    Args:
        restype: a :class:`~txlake.admin_types.ResourceType` (its name or number); not ANY.
        name: the resource name. resource_pattern_type: LITERAL or PREFIXED.
        principal: e.g. ``"User:alice"``. host: e.g. ``"*"``.
        operation: an :class:`AclOperation` (not ANY). permission_type: ALLOW or DENY.

    Raises:
        ValueError: a required argument is None, or an enum value not allowed here ("Cannot use
            enum ..."). TypeError: a name, principal or host that is not a str.
    """

    _forbidden: dict[str, tuple] = {"restype": (ResourceType.ANY,),
                                    "resource_pattern_type": (ResourcePatternType.ANY, ResourcePatternType.MATCH),
                                    "operation": (AclOperation.ANY,), "permission_type": (AclPermissionType.ANY,)}
    _required = ("restype", "name", "resource_pattern_type", "principal", "host", "operation", "permission_type")

    def __init__(self, restype: Any, name: str | None, resource_pattern_type: Any, principal: str | None,
                 host: str | None, operation: Any, permission_type: Any):
        values = {"restype": restype, "name": name, "resource_pattern_type": resource_pattern_type,
                  "principal": principal, "host": host, "operation": operation, "permission_type": permission_type}
        for key in self._required:
            if values[key] is None:
                raise ValueError(f"Expected {key} to be not None")
        for key in ("name", "principal", "host"):
            if values[key] is not None and not isinstance(values[key], str):
                raise TypeError(f"Expected {key} to be a string")
        self.restype = _enum(restype, ResourceType)
        self.name = name
        self.resource_pattern_type = _enum(resource_pattern_type, ResourcePatternType)
        self.principal = principal
        self.host = host
        self.operation = _enum(operation, AclOperation)
        self.permission_type = _enum(permission_type, AclPermissionType)
        for key, forbidden in self._forbidden.items():
            if getattr(self, key) in forbidden:
                raise ValueError(f"Cannot use enum {key}, value {getattr(self, key).name} in this class")
        self.restype_int = int(self.restype.value)
        self.resource_pattern_type_int = int(self.resource_pattern_type.value)
        self.operation_int = int(self.operation.value)
        self.permission_type_int = int(self.permission_type.value)

    def _to_tuple(self) -> tuple:
        return (self.restype, self.name, self.resource_pattern_type, self.principal, self.host, self.operation,
                self.permission_type)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({','.join(str(v) for v in self._to_tuple())})"

    def __hash__(self) -> int:
        return hash(self._to_tuple())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AclBinding):
            return NotImplemented
        return self._to_tuple() == other._to_tuple()

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, AclBinding):
            return NotImplemented
        return tuple(v.value if hasattr(v, "value") else v or "" for v in self._to_tuple()) < \
            tuple(v.value if hasattr(v, "value") else v or "" for v in other._to_tuple())


class AclBindingFilter(AclBinding):
    """A filter of ACLs (confluent-kafka's ``AclBindingFilter``): None matches any name, principal
    or host; ANY any enum value; ``ResourcePatternType.MATCH`` matches by pattern."""

    _forbidden = {"restype": (ResourceType.UNKNOWN,), "resource_pattern_type": (ResourcePatternType.UNKNOWN,),
                  "operation": (AclOperation.UNKNOWN,), "permission_type": (AclPermissionType.UNKNOWN,)}
    _required = ("restype", "resource_pattern_type", "operation", "permission_type")


class ScramMechanism(_Ordered):
    """A SASL/SCRAM mechanism (confluent-kafka's ``ScramMechanism``; Kafka's ids)."""

    UNKNOWN = 0
    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2


class ScramCredentialInfo:
    """A SCRAM credential's mechanism and iteration count (confluent-kafka's ``ScramCredentialInfo``)."""

    def __init__(self, mechanism: ScramMechanism, iterations: int):
        self.mechanism = mechanism
        self.iterations = iterations


class UserScramCredentialsDescription:
    """A user's SCRAM credentials (confluent-kafka's ``UserScramCredentialsDescription``)."""

    def __init__(self, user: str, scram_credential_infos: list[ScramCredentialInfo]):
        self.user = user
        self.scram_credential_infos = scram_credential_infos


class UserScramCredentialAlteration:
    """A change to a user's SCRAM credentials (confluent-kafka's ``UserScramCredentialAlteration``)."""

    def __init__(self, user: str):
        self.user = user


class UserScramCredentialUpsertion(UserScramCredentialAlteration):
    """Set a user's SCRAM credential (``password`` bytes, optional ``salt`` bytes)."""

    def __init__(self, user: str, scram_credential_info: ScramCredentialInfo, password: bytes,
                 salt: bytes | None = None):
        super().__init__(user)
        self.scram_credential_info = scram_credential_info
        self.password = password
        self.salt = salt


class UserScramCredentialDeletion(UserScramCredentialAlteration):
    """Delete a user's SCRAM credential of one mechanism."""

    def __init__(self, user: str, mechanism: ScramMechanism):
        super().__init__(user)
        self.mechanism = mechanism

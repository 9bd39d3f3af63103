"""Security APIs of a broker without an authorizer and without SASL: CreateAcls, DescribeAcls,
DeleteAcls (Kafka's ``AclApis`` with no ``authorizer.class.name``), DescribeUserScramCredentials
and AlterUserScramCredentials (Kafka's ``KafkaApis.handleDescribeUserScramCredentialsRequest`` and
the controller's ``ScramControlManager``).

txlake serves no authentication and no authorization (docs/server.md): every client may do
everything. The ACL APIs answer exactly what an Apache Kafka 4.3 broker without an authorizer
answers (checked against one, tests/test_admin_groups.py): SECURITY_DISABLED (54) with
"No Authorizer is configured." for each creation and each deletion filter, and "No Authorizer is
configured on the broker" as DescribeAcls' top-level error.

SCRAM: there are no credentials, and none can be stored (nothing would ever check them).
DescribeUserScramCredentials answers as Kafka with no credentials: nothing for "all users",
RESOURCE_NOT_FOUND (91) "Attempt to describe a user credential that does not exist: U" for a
named user, DUPLICATE_RESOURCE (92) for a user named twice. AlterUserScramCredentials checks
what Kafka checks first (a mechanism Kafka does not know: UNSUPPORTED_SASL_MECHANISM "Unknown
SCRAM mechanism"; iterations outside 4096..16384: UNACCEPTABLE_CREDENTIAL "Too few iterations" /
"Too many iterations"; a (user, mechanism) altered twice: DUPLICATE_RESOURCE), then answers a
deletion RESOURCE_NOT_FOUND "Attempt to delete a user credential that does not exist" (as Kafka
with no credentials) and refuses an upsertion with UNSUPPORTED_SASL_MECHANISM: this broker
supports no SASL mechanism at all, so a credential could never be used (where Kafka would store it).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kafka.protocol.admin import (AlterUserScramCredentialsResponse, CreateAclsResponse, DeleteAclsResponse,
                                  DescribeAclsResponse, DescribeUserScramCredentialsResponse)
from kafka.protocol.api_key import ApiKey

from ..errors import Errors
from .api_spec import ApiNode, ApiSpec, RequestContext

#: Kafka's answers without an authorizer (``AclApis``)
NO_AUTHORIZER_MESSAGE = "No Authorizer is configured."
NO_AUTHORIZER_ON_BROKER_MESSAGE = "No Authorizer is configured on the broker"
#: Kafka's ``ScramMechanism`` ids (SCRAM-SHA-256, SCRAM-SHA-512) and iteration bounds
SCRAM_MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
SCRAM_MIN_ITERATIONS, SCRAM_MAX_ITERATIONS = 4096, 16384


# ---------------------------------------------------------------------------- ACLs
def handle_create_acls(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """CreateAcls: SECURITY_DISABLED "No Authorizer is configured." for every creation."""
    return _create_acls_error(request, context.api_version, Errors.SECURITY_DISABLED, NO_AUTHORIZER_MESSAGE)


def _create_acls_error(request: Any, version: int, error: Errors, message: str | None = None) -> Any:
    return CreateAclsResponse(throttle_time_ms=0, results=[
        CreateAclsResponse.AclCreationResult(error_code=int(error), error_message=message)
        for _ in request.creations])


def handle_describe_acls(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DescribeAcls: SECURITY_DISABLED "No Authorizer is configured on the broker", no resources."""
    return _describe_acls_error(request, context.api_version, Errors.SECURITY_DISABLED,
                                NO_AUTHORIZER_ON_BROKER_MESSAGE)


def _describe_acls_error(request: Any, version: int, error: Errors, message: str | None = None) -> Any:
    return DescribeAclsResponse(throttle_time_ms=0, error_code=int(error), error_message=message, resources=[])


def handle_delete_acls(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DeleteAcls: SECURITY_DISABLED "No Authorizer is configured." for every filter, nothing matched."""
    return _delete_acls_error(request, context.api_version, Errors.SECURITY_DISABLED, NO_AUTHORIZER_MESSAGE)


def _delete_acls_error(request: Any, version: int, error: Errors, message: str | None = None) -> Any:
    return DeleteAclsResponse(throttle_time_ms=0, filter_results=[
        DeleteAclsResponse.DeleteAclsFilterResult(error_code=int(error), error_message=message, matching_acls=[])
        for _ in request.filters])


# ---------------------------------------------------------------------------- SCRAM
def handle_describe_user_scram_credentials(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DescribeUserScramCredentials with no credentials stored (module docstring)."""
    R = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult
    names = [u.name for u in request.users or []]
    counts = Counter(names)
    results = []
    for name in dict.fromkeys(names):
        if counts[name] > 1:
            results.append(R(user=name, error_code=int(Errors.DUPLICATE_RESOURCE), credential_infos=[],
                             error_message=f"Cannot describe SCRAM credentials for the same user twice in a "
                                           f"single request: {name}"))
        else:
            results.append(R(user=name, error_code=int(Errors.RESOURCE_NOT_FOUND), credential_infos=[],
                             error_message=f"Attempt to describe a user credential that does not exist: {name}"))
    return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=0, error_message=None, results=results)


def _describe_user_scram_credentials_error(request: Any, version: int, error: Errors) -> Any:
    return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=int(error), error_message=None,
                                                results=[])


def handle_alter_user_scram_credentials(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """AlterUserScramCredentials: Kafka's checks, then RESOURCE_NOT_FOUND for a deletion and
    UNSUPPORTED_SASL_MECHANISM for an upsertion (module docstring). Upsertions are answered first,
    then deletions, as Kafka's controller answers them."""
    alterations = [(u.name, u.mechanism, u.iterations) for u in request.upsertions]
    deletions = [(d.name, d.mechanism, None) for d in request.deletions]
    twice = Counter((name, mechanism) for name, mechanism, _ in alterations + deletions)
    results = []
    for name, mechanism, iterations in alterations + deletions:
        if twice[(name, mechanism)] > 1:
            error, message = Errors.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"
        elif mechanism not in SCRAM_MECHANISMS:
            error, message = Errors.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
        elif iterations is None:
            error, message = Errors.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"
        elif iterations < SCRAM_MIN_ITERATIONS:
            error, message = Errors.UNACCEPTABLE_CREDENTIAL, "Too few iterations"
        elif iterations > SCRAM_MAX_ITERATIONS:
            error, message = Errors.UNACCEPTABLE_CREDENTIAL, "Too many iterations"
        else:
            error, message = Errors.UNSUPPORTED_SASL_MECHANISM, (
                f"This broker serves no SASL mechanism: a {SCRAM_MECHANISMS[mechanism]} credential for {name} "
                "could never be used, so none is stored (docs/server.md)")
        results.append(AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult(
            user=name, error_code=int(error), error_message=message))
    return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)


def _alter_user_scram_credentials_error(request: Any, version: int, error: Errors) -> Any:
    return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=[
        AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult(user=u.name, error_code=int(error),
                                                                          error_message=None)
        for u in list(request.upsertions) + list(request.deletions)])


APIS = [
    ApiSpec(ApiKey.DescribeAcls, 1, 3, handle_describe_acls, _describe_acls_error),
    ApiSpec(ApiKey.CreateAcls, 1, 3, handle_create_acls, _create_acls_error),
    ApiSpec(ApiKey.DeleteAcls, 1, 3, handle_delete_acls, _delete_acls_error),
    ApiSpec(ApiKey.DescribeUserScramCredentials, 0, 0, handle_describe_user_scram_credentials,
            _describe_user_scram_credentials_error),
    ApiSpec(ApiKey.AlterUserScramCredentials, 0, 0, handle_alter_user_scram_credentials,
            _alter_user_scram_credentials_error),
]

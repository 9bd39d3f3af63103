"""Redaction of credentials in what txlake prints: reprs, log lines, error messages, CLI output.

The one place that decides what is secret, so every printer agrees (librdkafka does the
same for its sensitive properties: its config dump shows them as ``[redacted]``).

Secret are

* the value of every configuration key or storage option whose name contains ``key``,
  ``secret``, ``token``, ``password``, ``passwd`` or ``credential`` (case-insensitive),
  at any depth of nested option dicts -- s3fs's ``key`` / ``secret`` / ``token``,
  ``client_kwargs.aws_secret_access_key``, ``s3_additional_kwargs.SSECustomerKey`` --
  and Kafka's password-typed properties: ``sasl.password``, ``ssl.key.password``,
  ``ssl.keystore.password``, ``ssl.truststore.password`` (by the same rule) plus
  ``sasl.jaas.config`` and ``sasl.oauthbearer.config``, which embed credentials;
* a ``storage.options`` value that is not a dict (it cannot be told apart);
* the userinfo of a URL that carries a password (``s3://KEY:SECRET@bucket`` ->
  ``s3://[redacted]@bucket``; a bare user name as in ``abfs://container@account`` stays)
  and the values of secret-named query parameters (``?sig=...``).

Over-redaction is harmless (a non-secret value shown as ``[redacted]``); the rule errs
that way.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = ["REDACTED", "is_secret_key", "redact_config", "redact_url", "redact_value", "url_has_credentials"]

#: What a secret is replaced with (librdkafka's marker).
REDACTED = "[redacted]"

_SECRET_NAME = re.compile(r"key|secret|token|passw(or)?d|credential|jaas|oauthbearer\.config|sig(nature)?$",
                          re.IGNORECASE)
#: keys whose whole value is a dict of storage options (a non-dict value is redacted whole)
_OPTION_CONTAINERS = frozenset({"storage.options", "storage_options"})


def is_secret_key(name: object) -> bool:
    """True when the value of a config key / storage option called ``name`` is a secret
    (see the module docstring for the rule)."""
    return isinstance(name, str) and _SECRET_NAME.search(name) is not None


def _userinfo_span(url: str) -> tuple[int, int] | None:
    """``(start, end)`` of the userinfo of ``url`` when it holds a password (``user:pass@``), else None.

    The userinfo is what lies between ``://`` and the first ``@`` when it has a ``:`` and
    no ``/``, ``?`` or ``#`` before that ``:`` (a secret may itself hold ``/``, as AWS
    secret keys do). A path holding ``:`` and ``@`` (``file:///a:b@c``) is not userinfo.
    """
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    start = scheme_end + 3
    at = url.find("@", start)
    if at < 0:
        return None
    head = url[start:at]
    colon = head.find(":")
    if colon < 0 or any(c in head[:colon] for c in "/?#"):
        return None
    return start, at


def url_has_credentials(url: str) -> bool:
    """True when ``url`` carries a password in its userinfo (``scheme://user:password@host/...``)."""
    return isinstance(url, str) and _userinfo_span(url) is not None


def redact_url(url: str) -> str:
    """``url`` with a password-bearing userinfo and secret-named query values replaced by
    :data:`REDACTED`; anything else (and a non-URL string) unchanged.

    >>> redact_url("s3://AKIA:abc/def@bucket/prefix")
    's3://[redacted]@bucket/prefix'
    """
    if not isinstance(url, str):
        return url
    span = _userinfo_span(url)
    if span is not None:
        url = url[:span[0]] + REDACTED + url[span[1]:]
    q = url.find("?", url.find("://") + 3 if "://" in url else 0)
    if q >= 0:
        end = url.find("#", q)
        end = len(url) if end < 0 else end
        params = []
        for part in url[q + 1:end].split("&"):
            name, sep, _ = part.partition("=")
            params.append(f"{name}={REDACTED}" if sep and is_secret_key(name) else part)
        url = url[:q + 1] + "&".join(params) + url[end:]
    return url


def redact_value(key: object, value: Any) -> Any:
    """The value of config key / option ``key`` as it may be printed: :data:`REDACTED` for a
    secret (None stays None: "not set" is no secret), dicts and lists redacted inside, URLs
    (strings holding ``://``) through :func:`redact_url`."""
    if value is None:
        return None
    if is_secret_key(key):
        return REDACTED
    if isinstance(value, Mapping):
        return redact_config(value)
    if isinstance(key, str) and key in _OPTION_CONTAINERS:
        return REDACTED
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(None, v) for v in value)
    if isinstance(value, str) and "://" in value:
        return redact_url(value)
    return value


def redact_config(conf: Mapping[Any, Any] | None) -> dict:
    """A copy of ``conf`` (a client config, storage options, Spark options; nested dicts too)
    safe to print: every secret value is :data:`REDACTED` (see the module docstring).

    ``conf`` itself is not changed.
    """
    if conf is None:
        return {}
    return {k: redact_value(k, v) for k, v in conf.items()}

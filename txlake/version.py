"""txlake's version as confluent-kafka reports its own: ``version()`` and ``libversion()``
return ``(version string, version int)``, the int in librdkafka's ``0xMMmmrrxx`` form
(major, minor, revision, 0xff for a release)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

try:
    __version__ = _distribution_version("txlake")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"


def _version_int(text: str) -> int:
    parts = [int(p) if p.isdigit() else 0 for p in text.split(".")[:3]]
    major, minor, revision = (parts + [0, 0, 0])[:3]
    return (major << 24) | (minor << 16) | (revision << 8) | 0xFF


def version() -> str:
    """txlake's version string, ``"0.1.0"`` (confluent-kafka 2.x's ``version()`` returns its
    module version string only; ``libversion()`` has the (string, int) pair)."""
    return __version__


def libversion() -> tuple[str, int]:
    """The version of the engine the clients run on -- txlake's own (there is no librdkafka
    underneath) -- as confluent-kafka's ``libversion()``: ``("0.1.0", 0x000100ff)``."""
    return __version__, _version_int(__version__)

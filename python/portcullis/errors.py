"""Exceptions: one class per relay error code, and a few for what happens
on this side (connecting, a lost connection, a local file).

Every exception is a :class:`PortcullisError` carrying ``code`` (the relay
error code, e.g. ``"permission_denied"``; ``None`` for local failures),
``message``, ``details`` (the gateway's ``details`` object, if any) and
``recoverable``.
"""

from __future__ import annotations

import json
from typing import Any


class PortcullisError(Exception):
    """Base class of everything this package raises about a gateway."""

    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: Any = None,
        recoverable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details
        self.recoverable = recoverable

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.code else self.message


class RemoteError(PortcullisError):
    """The gateway answered a request with an error."""


class InvalidRequest(RemoteError):
    code = "invalid_request"


class UnknownMethod(RemoteError):
    code = "unknown_method"


class CapabilityUnavailable(RemoteError):
    code = "capability_unavailable"


class PermissionDenied(RemoteError):
    code = "permission_denied"


class ApprovalRequired(RemoteError):
    code = "approval_required"


class PolicyBlocked(RemoteError):
    code = "policy_blocked"


class NotFound(RemoteError):
    code = "not_found"


class Timeout(RemoteError):
    """The gateway's own limit ended the request (``details`` holds what it
    produced), or, with ``code`` None, this side gave up waiting."""

    code: str | None = "timeout"


class Cancelled(RemoteError):
    code = "cancelled"


class ProviderError(RemoteError):
    code = "provider_error"


class RelayDisconnected(RemoteError):
    code = "relay_disconnected"


class ArtifactError(RemoteError):
    code = "artifact_error"


class ConnectError(PortcullisError):
    """The connection could not be made: address, TLS, upgrade, handshake
    (a gateway key that does not match is one)."""


class Disconnected(PortcullisError):
    """The connection ended while this request waited."""


class ProtocolError(PortcullisError):
    """The gateway said something this client cannot use."""


class LocalError(PortcullisError):
    """Something on this side failed: a local file, a closed call."""


_BY_CODE: dict[str, type[RemoteError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        UnknownMethod,
        CapabilityUnavailable,
        PermissionDenied,
        ApprovalRequired,
        PolicyBlocked,
        NotFound,
        Timeout,
        Cancelled,
        ProviderError,
        RelayDisconnected,
        ArtifactError,
    )
    if cls.code is not None
}

_BY_KIND: dict[str, type[PortcullisError]] = {
    "connect": ConnectError,
    "disconnected": Disconnected,
    "protocol": ProtocolError,
    "local": LocalError,
}


def error_for_code(code: str) -> type[RemoteError]:
    """The class for a relay error code (``RemoteError`` for one this
    package does not know)."""
    return _BY_CODE.get(code, RemoteError)


def _from_native(
    kind: str, code: str, message: str, details: str | None, recoverable: bool
) -> PortcullisError:
    """Called by the native module to make the exception it raises."""
    parsed = json.loads(details) if details is not None else None
    if kind == "remote":
        return error_for_code(code)(message, code=code, details=parsed, recoverable=recoverable)
    if kind == "timeout":
        error = Timeout(message, details=parsed, recoverable=recoverable)
        error.code = None
        return error
    return _BY_KIND.get(kind, PortcullisError)(message, details=parsed, recoverable=recoverable)


__all__ = [
    "PortcullisError",
    "RemoteError",
    "InvalidRequest",
    "UnknownMethod",
    "CapabilityUnavailable",
    "PermissionDenied",
    "ApprovalRequired",
    "PolicyBlocked",
    "NotFound",
    "Timeout",
    "Cancelled",
    "ProviderError",
    "RelayDisconnected",
    "ArtifactError",
    "ConnectError",
    "Disconnected",
    "ProtocolError",
    "LocalError",
    "error_for_code",
]

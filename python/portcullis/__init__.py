"""portcullis: an asyncio client for portcullis gateways.

>>> import portcullis
>>> async def main() -> None:
...     async with await portcullis.connect(
...         "ws://127.0.0.1:7443", gateway_key="…", identity="client.key"
...     ) as gw:
...         print(await gw.files.read_text("/workspace/demo/README.md"))
...         result = await gw.shell.exec(["ls", "-la"], cwd="/workspace/demo")

The wire, its Noise channel and key pinning are the Rust client's
(``portcullis._native``); ``portcullis.ya_agent`` (the ``ya-agent`` extra)
backs a ya-agent-sdk ``Environment`` with a gateway.
"""

from . import errors
from ._native import __version__, generate_key, public_key
from .client import (
    Call,
    Client,
    Context,
    Event,
    ExecResult,
    Listener,
    Output,
    Process,
    ProcessResult,
    Root,
    Watch,
    connect,
    listen,
    runtime_context,
)
from .errors import (
    ApprovalRequired,
    ArtifactError,
    Cancelled,
    CapabilityUnavailable,
    ConnectError,
    Disconnected,
    InvalidRequest,
    LocalError,
    NotFound,
    PermissionDenied,
    PolicyBlocked,
    PortcullisError,
    ProtocolError,
    ProviderError,
    RelayDisconnected,
    RemoteError,
    Timeout,
    UnknownMethod,
)

__all__ = [
    "__version__",
    "errors",
    "generate_key",
    "public_key",
    "connect",
    "listen",
    "runtime_context",
    "Call",
    "Client",
    "Context",
    "Event",
    "ExecResult",
    "Listener",
    "Output",
    "Process",
    "ProcessResult",
    "Root",
    "Watch",
    "ApprovalRequired",
    "ArtifactError",
    "Cancelled",
    "CapabilityUnavailable",
    "ConnectError",
    "Disconnected",
    "InvalidRequest",
    "LocalError",
    "NotFound",
    "PermissionDenied",
    "PolicyBlocked",
    "PortcullisError",
    "ProtocolError",
    "ProviderError",
    "RelayDisconnected",
    "RemoteError",
    "Timeout",
    "UnknownMethod",
]

"""An MCP server written with the official MCP Python SDK (`MCPServer`),
which the tests run behind `[[tool]]`s of a gateway's policy: the gateway
starts it in its command sandbox and speaks MCP to it over stdio."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notes", version="1.0")


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Adds two numbers (a structured result)."""
    return {"sum": a + b}


@server.tool(structured_output=False)
def shout(text: str) -> str:
    """Upper-cases text (a text result)."""
    return text.upper()


@server.tool(structured_output=False)
def token() -> str:
    """Tells the secret it was given: the gateway must redact it."""
    return "the token is " + os.environ.get("NOTES_TOKEN", "(unset)")


@server.tool()
def sees(path: str) -> bool:
    """Whether a host path exists in the server's world."""
    return os.path.exists(path)


@server.tool()
def processes() -> int:
    """How many processes the server's /proc shows."""
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


@server.tool()
def fail(why: str) -> str:
    """Fails: an MCP tool error."""
    raise ToolError(why)


@server.tool()
def crash() -> str:
    """Exits the server mid-call."""
    os._exit(3)


@server.tool()
def hang() -> str:
    """Never answers (the gateway's call_timeout ends it)."""
    time.sleep(3600)
    return "late"


def serve_http(port_file: str, token: str) -> None:
    """Streamable HTTP on 127.0.0.1 (a port of the kernel's choice, written
    to `port_file`); a request without `Authorization: Bearer <token>` is
    refused with 401."""
    import socket

    import uvicorn

    app = server.streamable_http_app()
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"a bearer token is required"})
            return
        await app(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is told: a connection waits for uvicorn.
    sock.listen(128)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(sock.getsockname()[1]))
    os.rename(port_file + ".tmp", port_file)
    uvicorn.Server(uvicorn.Config(guarded, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--http":
        serve_http(sys.argv[2], sys.argv[3])
    else:
        server.run()

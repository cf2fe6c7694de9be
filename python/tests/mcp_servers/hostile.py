"""A hand-written MCP server that misbehaves on purpose: it answers the
handshake properly, then sends what no MCP peer should — lines that are
not JSON-RPC, a line longer than any message may be, an answer that never
ends. Plain stdio and json only, so it does exactly what it says."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

out = sys.stdout.buffer


def send(message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def result(request_id: Any, value: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": value})


TOOLS = [
    {"name": name, "description": name, "inputSchema": {"type": "object"}}
    for name in ("garbage", "huge", "endless")
]

for line in sys.stdin.buffer:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        result(
            request_id,
            {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "0"},
            },
        )
    elif method == "tools/list":
        result(request_id, {"tools": TOOLS})
    elif method == "tools/call":
        name = message["params"]["name"]
        if name == "garbage":
            out.write(b"this is not json\n{\"jsonrpc\": \"2.0\"}\n[1, 2\n\xff\xfe\n")
            result(request_id, {"content": [{"type": "text", "text": "after the garbage"}]})
        elif name == "huge":
            # 17 MiB in one line: more than a message may take.
            out.write(b'{"jsonrpc": "2.0", "pad": "' + b"x" * (17 << 20) + b'"}\n')
            result(request_id, {"content": [{"type": "text", "text": "after the huge line"}]})
        elif name == "endless":
            # A line that never ends (bounded here in time, 60 s).
            until = time.monotonic() + 60
            chunk = b"y" * 65536
            while time.monotonic() < until:
                out.write(chunk)
                out.flush()

"""MCP servers behind `[[tool]]`s: the gateway starts an MCP server written
with the official MCP Python SDK (mcp_servers/notes.py) in its command
sandbox and offers its tools under the policy's names, risks and approval
rules; `tool.call` and a Rhai script's `call_tool` reach it through the one
decide → audit → execute → audit path, with the server's secrets redacted.
A hand-written hostile server (mcp_servers/hostile.py) and the SDK server's
own crash and hang show a misbehaving server costs only its own calls."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import portcullis
from conftest import Gateway, binary, start_gateway

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
SECRET = "nt-7f3a9c1e5b"

POLICY = """
[[principal]]
id = "alice"
public_key = "ALICE_KEY"

[[root]]
id = "main"
path = "GWDIR/workspace"
virtual_path = "/workspace/main"

[[root]]
id = "venv"
path = "VENV"
virtual_path = "/venv"

[[root]]
id = "python"
path = "INTERPRETER_HOME"
virtual_path = "/python"

[[root]]
id = "servers"
path = "SERVERS"
virtual_path = "/servers"

[[mcp_server]]
name = "notes"
command = ["PYTHON", "SERVERS/notes.py"]
roots = { venv = "ro", python = "ro", servers = "ro", main = "rw" }
secrets = { NOTES_TOKEN = "notes_token" }
call_timeout = "3s"

[[mcp_server]]
name = "hostile"
command = ["PYTHON", "SERVERS/hostile.py"]
roots = { venv = "ro", python = "ro", servers = "ro" }
call_timeout = "3s"

[[tool]]
name = "add"
description = "Adds two numbers"
risk = "low"
approval_policy = "allow"
mcp = { server = "notes" }
input_schema = { type = "object", properties = { a = { type = "integer" }, b = { type = "integer" } }, required = ["a", "b"] }

[[tool]]
name = "loud"
description = "Upper-cases text, with the operator's approval"
risk = "medium"
approval_policy = "always_ask"
mcp = { server = "notes", tool = "shout" }
input_schema = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[[tool]]
name = "notes_token"
description = "Tells its secret (which must never leave)"
risk = "high"
approval_policy = "allow"
mcp = { server = "notes", tool = "token" }
input_schema = { type = "object" }

[[tool]]
name = "sees"
description = "Whether a path exists for the server"
risk = "low"
approval_policy = "allow"
mcp = { server = "notes" }
input_schema = { type = "object", properties = { path = { type = "string" } }, required = ["path"] }

[[tool]]
name = "processes"
description = "Processes the server sees"
risk = "low"
approval_policy = "allow"
mcp = { server = "notes" }
input_schema = { type = "object" }

[[tool]]
name = "fail"
description = "An MCP tool error"
risk = "low"
approval_policy = "allow"
mcp = { server = "notes" }
input_schema = { type = "object" }

[[tool]]
name = "crash"
description = "Exits the server"
risk = "low"
approval_policy = "allow"
mcp = { server = "notes" }
input_schema = { type = "object" }

[[tool]]
name = "hang"
description = "Never answers"
risk = "low"
approval_policy = "allow"
mcp = { server = "notes" }
input_schema = { type = "object" }

[[tool]]
name = "unlisted"
description = "A tool the server does not have"
risk = "low"
approval_policy = "allow"
mcp = { server = "notes", tool = "nope" }
input_schema = { type = "object" }

[[tool]]
name = "garbage"
description = "Lines that are not JSON-RPC, then an answer"
risk = "low"
approval_policy = "allow"
mcp = { server = "hostile" }
input_schema = { type = "object" }

[[tool]]
name = "huge"
description = "A 17 MiB line, then an answer"
risk = "low"
approval_policy = "allow"
mcp = { server = "hostile" }
input_schema = { type = "object" }

[[tool]]
name = "endless"
description = "A line that never ends"
risk = "low"
approval_policy = "allow"
mcp = { server = "hostile" }
input_schema = { type = "object" }

[[grant]]
id = "alice"
principals = ["alice"]
fileops = { main = "rw" }
scripts = {}
tools = { allow = ["*"] }
"""


def start() -> Gateway:
    policy = (
        POLICY.replace("PYTHON", sys.executable)
        .replace("VENV", sys.prefix)
        # The venv's interpreter may live outside the system directories
        # the world shows (pyenv's, under /root).
        .replace("INTERPRETER_HOME", sys.base_prefix)
        .replace("SERVERS", str(SERVERS))
    )
    gateway = start_gateway(policy, 'secrets_dir = "secrets"\napproval_timeout = "20s"')
    return gateway


@pytest.fixture
def mcp_gateway() -> Iterator[Gateway]:
    gateway = start()
    secrets = gateway.dir / "secrets"
    secrets.mkdir()
    (secrets / "notes_token").write_text(SECRET + "\n")
    try:
        yield gateway
    finally:
        gateway.stop()
        shutil.rmtree(gateway.dir, ignore_errors=True)


@pytest.fixture
async def alice(mcp_gateway: Gateway) -> AsyncIterator[portcullis.Client]:
    client = await mcp_gateway.connect()
    try:
        yield client
    finally:
        await client.close()


def approvals(gateway: Gateway, *args: str) -> str:
    """`portcullis approvals …` on the gateway's admin socket."""
    out = subprocess.run(
        [str(binary()), "approvals", *args, "--admin-socket", str(gateway.dir / "admin.sock")],
        capture_output=True,
        check=True,
    )
    return out.stdout.decode()


def tool_calls(gateway: Gateway) -> list[dict[str, Any]]:
    return [e for e in gateway.audit("--method", "tool.call") if e.get("kind") == "request"]


async def test_an_sdk_server_s_tools_answer_through_tool_call(
    alice: portcullis.Client, mcp_gateway: Gateway
) -> None:
    listed = {t["name"]: t for t in await alice.tools.list()}
    assert listed["add"]["risk"] == "low"
    assert listed["loud"]["approval_policy"] == "always_ask"
    # A structured result is the value; a text result its text.
    assert await alice.tools.call("add", {"a": 2, "b": 40}) == {"sum": 42}
    # The policy's schema is checked before the server is asked.
    with pytest.raises(portcullis.InvalidRequest):
        await alice.tools.call("add", {"a": "two", "b": 40})
    # A tool error of the server's is a provider_error with its text.
    with pytest.raises(portcullis.ProviderError, match="the disk is on fire"):
        await alice.tools.call("fail", {"why": "the disk is on fire"})
    # A tool the server does not list: said, with what it lists.
    with pytest.raises(portcullis.NotFound, match="has no tool `nope`"):
        await alice.tools.call("unlisted", {})
    entries = tool_calls(mcp_gateway)
    called = [e for e in entries if e.get("tool") in {"add", "fail", "unlisted"}]
    # Each call is audited: start and outcome (the schema refusal too).
    assert len(called) >= 4, json.dumps(entries, indent=1)


async def test_the_server_runs_in_the_command_sandbox_and_its_secret_never_leaves(
    alice: portcullis.Client, mcp_gateway: Gateway
) -> None:
    answer = await alice.tools.call("notes_token", {})
    assert answer == "the token is [REDACTED:notes_token]", answer
    # Its world: its roots, not the gateway's files; its own PID namespace.
    (mcp_gateway.workspace / "note.txt").write_text("x")
    # (A tool of the SDK's returning a plain type answers {"result": …}.)
    seen = await alice.tools.call("sees", {"path": str(mcp_gateway.workspace / "note.txt")})
    assert seen == {"result": True}
    for hidden in ["policy.toml", "gateway.key", "secrets/notes_token", "state"]:
        seen = await alice.tools.call("sees", {"path": str(mcp_gateway.dir / hidden)})
        assert seen == {"result": False}, hidden
    assert (await alice.tools.call("processes", {}))["result"] < 5
    text = json.dumps(mcp_gateway.audit())
    assert SECRET not in text
    assert SECRET not in (mcp_gateway.dir / "stderr.log").read_text()


async def test_a_script_calls_the_server_s_tool_and_approval_holds_it(
    alice: portcullis.Client, mcp_gateway: Gateway
) -> None:
    result = await alice.scripts.run('call_tool("add", #{a: 1, b: 2}).sum * 10')
    assert result["value"] == 30
    # always_ask: parked until the operator approves (from a script too).
    call = asyncio.create_task(alice.scripts.run('call_tool("loud", #{text: "hi"})'))
    pending: list[dict[str, Any]] = []
    for _ in range(100):
        pending = json.loads(approvals(mcp_gateway, "list", "--json"))["approvals"]
        if pending:
            break
        await asyncio.sleep(0.1)
    assert len(pending) == 1 and pending[0]["tool"] == "loud", pending
    assert not call.done()
    approvals(mcp_gateway, "approve", str(pending[0]["id"]))
    assert (await asyncio.wait_for(call, 20))["value"] == "HI"
    entry = next(e for e in tool_calls(mcp_gateway) if e.get("tool") == "loud")
    assert entry["parent_request_id"], entry


async def wait_until_started(alice: portcullis.Client, tool: str, args: dict[str, Any]) -> Any:
    """Calls `tool` until the server's backoff lets it start again."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await alice.tools.call(tool, args)
        except portcullis.ProviderError as e:
            assert "started again in" in e.message or "tried again in" in e.message, e
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_a_server_that_crashes_or_hangs_is_restarted_with_backoff(
    alice: portcullis.Client, mcp_gateway: Gateway
) -> None:
    assert await alice.tools.call("add", {"a": 1, "b": 1}) == {"sum": 2}
    with pytest.raises(portcullis.ProviderError, match="MCP server `notes` failed during the call"):
        await alice.tools.call("crash", {})
    # At once: the backoff says when it is tried again.
    with pytest.raises(portcullis.ProviderError, match="started again in"):
        await alice.tools.call("add", {"a": 1, "b": 1})
    assert await wait_until_started(alice, "add", {"a": 2, "b": 2}) == {"sum": 4}
    began = time.monotonic()
    with pytest.raises(portcullis.Timeout, match="call_timeout"):
        await alice.tools.call("hang", {})
    assert time.monotonic() - began < 10
    assert await wait_until_started(alice, "add", {"a": 3, "b": 3}) == {"sum": 6}
    # Other tools of the gateway never waited on it.
    with pytest.raises(portcullis.ProviderError):
        await alice.tools.call("fail", {"why": "still here"})


async def test_a_hostile_server_s_garbage_and_floods_cost_only_its_own_calls(
    alice: portcullis.Client, mcp_gateway: Gateway
) -> None:
    assert await alice.tools.call("garbage", {}) == "after the garbage"
    assert await alice.tools.call("huge", {}) == "after the huge line"
    began = time.monotonic()
    flood = asyncio.create_task(alice.tools.call("endless", {}))
    # The other server answers meanwhile.
    assert await alice.tools.call("add", {"a": 5, "b": 5}) == {"sum": 10}
    with pytest.raises(portcullis.Timeout):
        await flood
    assert time.monotonic() - began < 15
    # The gateway is still whole: its own status answers.
    assert mcp_gateway.process.poll() is None


HTTP_POLICY = """
[[principal]]
id = "alice"
public_key = "ALICE_KEY"

[[mcp_server]]
name = "remote"
url = "http://127.0.0.1:PORT/mcp"
bearer_secret = "remote_token"

[[mcp_server]]
name = "impostor"
url = "http://127.0.0.1:PORT/mcp"
bearer_secret = "wrong_token"

[[tool]]
name = "remote_add"
description = "Adds, on a server reached over HTTP"
risk = "low"
approval_policy = "allow"
mcp = { server = "remote", tool = "add" }
input_schema = { type = "object", properties = { a = { type = "integer" }, b = { type = "integer" } } }

[[tool]]
name = "remote_token"
description = "Tells the server's token"
risk = "low"
approval_policy = "allow"
mcp = { server = "remote", tool = "token" }
input_schema = { type = "object" }

[[tool]]
name = "impostor_add"
description = "The same server, with the wrong token"
risk = "low"
approval_policy = "allow"
mcp = { server = "impostor", tool = "add" }
input_schema = { type = "object" }

[[grant]]
id = "alice"
principals = ["alice"]
tools = { allow = ["*"] }
"""


async def test_a_server_on_loopback_is_reached_over_streamable_http_with_its_token(
    tmp_path: Path,
) -> None:
    token = "rt-" + os.urandom(8).hex()
    port_file = tmp_path / "port"
    # The SDK's server over Streamable HTTP, as an operator would run it
    # beside the gateway; it tells its own token back through `token`.
    server = subprocess.Popen(
        [sys.executable, str(SERVERS / "notes.py"), "--http", str(port_file), token],
        env={**os.environ, "NOTES_TOKEN": token},
    )
    try:
        for _ in range(200):
            if port_file.exists():
                break
            await asyncio.sleep(0.05)
        port = port_file.read_text()
        gateway = start_gateway(
            HTTP_POLICY.replace("PORT", port), 'secrets_dir = "secrets"'
        )
        try:
            (gateway.dir / "secrets").mkdir()
            (gateway.dir / "secrets" / "remote_token").write_text(token)
            (gateway.dir / "secrets" / "wrong_token").write_text("not-the-token")
            client = await gateway.connect()
            try:
                assert await client.tools.call("remote_add", {"a": 20, "b": 22}) == {"sum": 42}
                told = await client.tools.call("remote_token", {})
                assert told == "the token is [REDACTED:remote_token]", told
                with pytest.raises(portcullis.ProviderError, match="cannot start"):
                    await client.tools.call("impostor_add", {"a": 1, "b": 1})
            finally:
                await client.close()
            assert token not in json.dumps(gateway.audit())
            assert token not in (gateway.dir / "stderr.log").read_text()
        finally:
            gateway.stop()
            shutil.rmtree(gateway.dir, ignore_errors=True)
    finally:
        server.terminate()
        server.wait(10)

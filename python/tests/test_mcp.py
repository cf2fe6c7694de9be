"""`portcullis mcp` driven by the official MCP Python SDK (`mcp` on PyPI):
an independent MCP client lists a real gateway's grants as tools and calls
each kind; refusals are tool errors with the relay code; every call is one
audited request of the client's principal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolResult,
    ResourceListChangedNotification,
    TextContent,
    TextResourceContents,
    ToolListChangedNotification,
)

from conftest import Gateway, binary


def server(gateway: Gateway) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(binary()),
        args=[
            "mcp",
            gateway.url,
            "--gateway-key",
            gateway.key,
            "--identity",
            str(gateway.identity),
        ],
        # Where the client verb remembers gateway keys: not the real HOME.
        env={"HOME": str(gateway.dir), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )


@asynccontextmanager
async def session(gateway: Gateway) -> AsyncIterator[ClientSession]:
    async with stdio_client(server(gateway)) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            yield s


async def call(s: ClientSession, name: str, arguments: dict[str, Any]) -> CallToolResult:
    result = await s.call_tool(name, arguments)
    assert isinstance(result, CallToolResult), result
    return result


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text


async def test_an_mcp_client_lists_the_grants_and_calls_each_kind(gateway: Gateway) -> None:
    async with session(gateway) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools) == {
            "read_file",
            "write_file",
            "edit_file",
            "list_directory",
            "stat",
            "search_files",
            "run_command",
            "start_process",
            "read_process_output",
            "wait_process",
            "write_process_input",
            "signal_process",
            "kill_process",
            "run_script",
            "greet",
        }
        read_hints = tools["read_file"].annotations
        assert read_hints is not None and read_hints.read_only_hint is True
        write_hints = tools["write_file"].annotations
        assert write_hints is not None and write_hints.destructive_hint is True
        # The operator's tool keeps its JSON Schema.
        assert tools["greet"].input_schema["required"] == ["name"]

        wrote = await call(
            s, "write_file", {"path": "/workspace/main/notes/a.txt", "content": "alpha\nbeta\n", "create_parents": True}
        )
        assert not wrote.is_error, text(wrote)
        read = await call(s, "read_file", {"path": "/workspace/main/notes/a.txt"})
        assert text(read) == "alpha\nbeta\n"
        assert read.structured_content is not None and read.structured_content["size"] == 11
        listed = await call(s, "list_directory", {"path": "/workspace/main/notes"})
        assert listed.structured_content is not None
        assert [e["name"] for e in listed.structured_content["entries"]] == ["a.txt"]
        stat = await call(s, "stat", {"path": "/workspace/main/notes/a.txt"})
        assert stat.structured_content is not None and stat.structured_content["kind"] == "file"
        found = await call(s, "search_files", {"path": "/workspace/main", "pattern": "be.a"})
        assert found.structured_content is not None and found.structured_content["matches"] == 1
        ran = await call(s, "run_command", {"command": ["cat", "a.txt"], "cwd": "/workspace/main/notes"})
        assert not ran.is_error, text(ran)
        assert ran.structured_content is not None
        assert ran.structured_content["exit_code"] == 0
        assert ran.structured_content["stdout"] == "alpha\nbeta\n"
        greeted = await call(s, "greet", {"name": "mcp"})
        assert greeted.structured_content is not None
        assert greeted.structured_content["value"] == "hello mcp"
        scripted = await call(s, "run_script", {"source": "40 + 2"})
        assert scripted.structured_content is not None and scripted.structured_content["value"] == 42
        edited = await call(
            s, "edit_file", {"path": "/workspace/main/notes/a.txt", "edits": [{"old_text": "beta", "new_text": "gamma"}]}
        )
        assert not edited.is_error, text(edited)
        assert edited.structured_content is not None and edited.structured_content["replacements"] == 1
        # All or none: an edit that does not apply leaves the file as it was.
        ambiguous = await call(
            s,
            "edit_file",
            {
                "path": "/workspace/main/notes/a.txt",
                "edits": [{"old_text": "gamma", "new_text": "delta"}, {"old_text": "a", "new_text": "A"}],
            },
        )
        assert ambiguous.is_error and text(ambiguous).startswith("invalid_request:"), text(ambiguous)
        assert "edit 2: old_text occurs" in text(ambiguous), text(ambiguous)

        # Refusals are the gateway's, as tool errors naming the relay code.
        refused = await call(s, "run_command", {"command": ["rm", "-rf", "/workspace/main"]})
        assert refused.is_error and text(refused).startswith("permission_denied:"), text(refused)
        assert refused.structured_content is not None
        assert refused.structured_content["code"] == "permission_denied"
        escaped = await call(s, "read_file", {"path": "/workspace/main/../../etc/passwd"})
        assert escaped.is_error and text(escaped).startswith("permission_denied:"), text(escaped)
        elsewhere = await call(s, "read_file", {"path": "/etc/passwd"})
        assert elsewhere.is_error and "not under any root" in text(elsewhere)
        bad = await call(s, "greet", {"name": 7})
        assert bad.is_error and text(bad).startswith("invalid_request:"), text(bad)

        # The roots are resources.
        resources = (await s.list_resources()).resources
        assert [str(r.uri) for r in resources] == ["file:///workspace/main/"]
        content = (await s.read_resource("file:///workspace/main/notes/a.txt")).contents[0]
        assert isinstance(content, TextResourceContents) and content.text == "alpha\ngamma\n"

    # Every call that reached the gateway is one audited request of the
    # client's principal, named by its MCP request id.
    entries = [e for e in gateway.audit() if e.get("kind") == "request"]
    by_mcp = [e for e in entries if str(e.get("tool_call_id", "")).startswith("mcp-")]
    # 15 calls; the read of /etc/passwd named no root and never left.
    assert len(by_mcp) == 14, json.dumps(by_mcp, indent=1)
    assert len({e["tool_call_id"] for e in by_mcp}) == 14
    assert all(e["principal"] == "alice" for e in by_mcp)
    assert {e["method"] for e in by_mcp} >= {"file.write", "file.edit", "file.read", "shell.exec", "tool.call", "script.run"}
    assert any(e["method"] == "shell.exec" and e["decision"] == "blocked" for e in by_mcp)


async def test_processes_are_started_fed_read_signalled_and_waited_on(gateway: Gateway) -> None:
    async with session(gateway) as s:
        cat = await call(s, "start_process", {"command": ["cat"], "cwd": "/workspace/main"})
        assert not cat.is_error, text(cat)
        assert cat.structured_content is not None
        cat_id = cat.structured_content["process_id"]
        wrote = await call(s, "write_process_input", {"process_id": cat_id, "data": "typed\n", "eof": True})
        assert not wrote.is_error, text(wrote)
        done = await call(s, "wait_process", {"process_id": cat_id, "timeout_ms": 20000})
        assert done.structured_content is not None, text(done)
        assert done.structured_content["running"] is False
        assert done.structured_content["exit_code"] == 0
        assert done.structured_content["stdout"] == "typed\n"
        # Read again from where that ended: nothing new.
        again = await call(
            s, "read_process_output", {"process_id": cat_id, "from_seq": done.structured_content["next_seq"]}
        )
        assert again.structured_content is not None and again.structured_content["stdout"] == ""

        sleeper = await call(s, "start_process", {"command": ["sleep", "30"]})
        assert sleeper.structured_content is not None
        sleeper_id = sleeper.structured_content["process_id"]
        polled = await call(s, "read_process_output", {"process_id": sleeper_id})
        assert polled.structured_content is not None and polled.structured_content["running"] is True
        signalled = await call(s, "signal_process", {"process_id": sleeper_id, "signal": "TERM"})
        assert not signalled.is_error, text(signalled)
        ended = await call(s, "wait_process", {"process_id": sleeper_id, "timeout_ms": 20000})
        assert ended.structured_content is not None and ended.structured_content["running"] is False
        assert ended.structured_content["signal"] == "SIGTERM", ended.structured_content

        other = await call(s, "start_process", {"command": ["sleep", "30"]})
        assert other.structured_content is not None
        killed = await call(s, "kill_process", {"process_id": other.structured_content["process_id"]})
        assert not killed.is_error, text(killed)
        missing = await call(s, "wait_process", {"process_id": "p999-nothing"})
        assert missing.is_error and text(missing).startswith("not_found:"), text(missing)
        refused = await call(s, "start_process", {"command": ["rm", "-rf", "/"]})
        assert refused.is_error and text(refused).startswith("permission_denied:"), text(refused)


async def test_a_cancelled_call_cancels_the_relay_request(gateway: Gateway) -> None:
    async with session(gateway) as s:
        slow = asyncio.create_task(call(s, "run_command", {"command": ["sleep", "30"]}))
        await asyncio.sleep(1.0)
        slow.cancel()
        try:
            await slow
        except asyncio.CancelledError:
            pass
        # The session goes on.
        quick = await call(s, "run_command", {"command": ["true"]})
        assert not quick.is_error, text(quick)
    for _ in range(50):
        cancelled = [
            e
            for e in gateway.audit()
            if e.get("kind") == "request" and e.get("method") == "shell.exec" and e.get("status") == "cancelled"
        ]
        if cancelled:
            break
        await asyncio.sleep(0.1)
    assert cancelled, "the relay request was not cancelled"
    assert str(cancelled[0]["tool_call_id"]).startswith("mcp-")


async def test_a_long_command_reports_progress(gateway: Gateway) -> None:
    heard: list[tuple[float, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append((progress, message))

    async with session(gateway) as s:
        result = await s.call_tool("run_command", {"command": ["sleep", "2.5"]}, progress_callback=progress)
        assert isinstance(result, CallToolResult) and not result.is_error
    assert len(heard) >= 2, heard
    assert [done for done, _ in heard] == sorted(done for done, _ in heard)
    assert heard[0][1] is not None and "shell.exec running" in heard[0][1]


async def test_the_previous_protocol_revision_is_served_too(gateway: Gateway) -> None:
    params = server(gateway)
    process = await asyncio.create_subprocess_exec(
        params.command,
        *params.args,
        env=params.env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None

    async def exchange(message: dict[str, Any]) -> dict[str, Any] | None:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(message).encode() + b"\n")
        await process.stdin.drain()
        if "id" not in message:
            return None
        line = await asyncio.wait_for(process.stdout.readline(), 20)
        answer: dict[str, Any] = json.loads(line)
        return answer

    init = await exchange(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        }
    )
    assert init is not None and init["result"]["protocolVersion"] == "2025-11-25", init
    await exchange({"jsonrpc": "2.0", "method": "notifications/initialized"})
    listed = await exchange({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert listed is not None
    assert "read_file" in {t["name"] for t in listed["result"]["tools"]}
    # Garbage is answered, and the server goes on.
    process.stdin.write(b"{not json\n")
    await process.stdin.drain()
    again = await exchange({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
    while again is not None and again.get("id") != 3:
        again = json.loads(await asyncio.wait_for(process.stdout.readline(), 20))
    assert again is not None and "result" in again, again
    # A line past the transport's 16 MiB bound is dropped, not held.
    process.stdin.write(b"x" * (17 << 20) + b"\n")
    await process.stdin.drain()
    after = await exchange({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
    while after is not None and after.get("id") != 4:
        after = json.loads(await asyncio.wait_for(process.stdout.readline(), 20))
    assert after is not None and "result" in after, after
    process.stdin.close()
    assert await asyncio.wait_for(process.wait(), 20) == 0


async def test_streamable_http_with_a_bearer_token_on_loopback(gateway: Gateway) -> None:
    token = "mcp-http-token-0123456789"
    token_file = gateway.dir / "mcp.token"
    token_file.write_text(token + "\n")
    params = server(gateway)
    process = await asyncio.create_subprocess_exec(
        params.command,
        *params.args,
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        str(token_file),
        env=params.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 20)).decode().strip()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.removeprefix("listening on ")

        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
            async with streamable_http_client(url, http_client=http) as (incoming, outgoing):
                async with ClientSession(incoming, outgoing) as s:
                    await s.initialize()
                    names = {t.name for t in (await s.list_tools()).tools}
                    assert "read_file" in names and "run_command" in names
                    wrote = await call(s, "write_file", {"path": "/workspace/main/h.txt", "content": "over http"})
                    assert not wrote.is_error, text(wrote)
                    got = await call(s, "read_file", {"path": "/workspace/main/h.txt"})
                    assert text(got) == "over http"

        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        async with httpx2.AsyncClient() as plain:
            headers = {"Accept": "application/json, text/event-stream"}
            missing = await plain.post(url, json=body, headers=headers)
            assert missing.status_code == 401, missing.text
            wrong = await plain.post(url, json=body, headers={**headers, "Authorization": "Bearer not-the-token-at-all"})
            assert wrong.status_code == 401, wrong.text
            # A page in a browser on another origin is refused, token or not.
            foreign = await plain.post(
                url, json=body, headers={**headers, "Authorization": f"Bearer {token}", "Origin": "http://evil.example"}
            )
            assert foreign.status_code == 403, foreign.text
    finally:
        process.terminate()
        await process.wait()
    # The calls over HTTP are audited as the same principal's.
    assert any(
        e.get("method") == "file.write" and str(e.get("tool_call_id", "")).startswith("mcp-")
        for e in gateway.audit()
    )


async def test_a_policy_change_is_told_as_a_changed_tool_list(gateway: Gateway) -> None:
    heard: list[object] = []

    async def on_message(message: object) -> None:
        heard.append(message)

    async with stdio_client(server(gateway)) as (read, write):
        async with ClientSession(read, write, message_handler=on_message) as s:
            await s.initialize()
            before = {t.name for t in (await s.list_tools()).tools}
            assert "greet" in before
            # The operator takes the tools away and reloads.
            policy = gateway.dir / "policy.toml"
            text = policy.read_text()
            edited = text.replace('tools = { allow = ["greet"] }\n', "")
            assert edited != text
            policy.write_text(edited)
            gateway.process.send_signal(signal.SIGHUP)
            for _ in range(100):
                if any(isinstance(m, ToolListChangedNotification) for m in heard):
                    break
                await asyncio.sleep(0.1)
            assert any(isinstance(m, ToolListChangedNotification) for m in heard), heard
            # The roots did not change: no word about resources.
            assert not any(isinstance(m, ResourceListChangedNotification) for m in heard), heard
            after = {t.name for t in (await s.list_tools()).tools}
            assert after == before - {"greet"}, after
            # No longer a tool: MCP's error for an unknown tool.
            with pytest.raises(MCPError, match="no tool `greet`"):
                await s.call_tool("greet", {"name": "x"})

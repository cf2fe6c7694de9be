"""PortcullisEnvironment driven through ya-agent-sdk's own toolsets by a
real agent loop (pydantic-ai with a scripted FunctionModel: no network
model), against the real gateway."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic_ai.capabilities import Toolset as ToolsetCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from ya_agent_environment.exceptions import (
    FileOperationError,
    PathNotAllowedError,
    ShellExecutionError,
    ShellTimeoutError,
)
from ya_agent_sdk.agents.main import create_agent
from ya_agent_sdk.toolsets import Toolset
from ya_agent_sdk.toolsets.core.filesystem import tools as file_tools
from ya_agent_sdk.toolsets.core.shell import tools as shell_tools

import portcullis
from conftest import Gateway
from portcullis.ya_agent import PortcullisEnvironment, PortcullisFileOperator


def scripted(steps: list[list[tuple[str, dict[str, Any]]]], returns: list[tuple[str, Any]]) -> FunctionModel:
    """A model that makes ``steps[i]``'s tool calls on turn ``i``, records
    what each tool returned in ``returns``, then answers "done"."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts if isinstance(messages[-1], ModelRequest) else []:
            if isinstance(part, ToolReturnPart):
                returns.append((part.tool_name, part.content))
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn < len(steps):
            return ModelResponse(
                parts=[
                    ToolCallPart(name, args, tool_call_id=f"call-{turn}-{i}")
                    for i, (name, args) in enumerate(steps[turn])
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


async def run_agent(client: portcullis.Client, model: FunctionModel) -> str:
    toolset = Toolset([*file_tools, *shell_tools])
    runtime = create_agent(
        model,
        env=PortcullisEnvironment(client=client),
        capabilities=[ToolsetCapability(toolset)],
    )
    async with runtime:
        result = await runtime.agent.run("work on the repository", deps=runtime.ctx)
        run_id = str(runtime.ctx.run_id)
    assert result.output == "done"
    return run_id


async def test_an_agent_reads_edits_searches_and_runs_commands(
    client: portcullis.Client, gateway: Gateway
) -> None:
    (gateway.workspace / "README.md").write_text("# demo\nversion = 1\n")
    (gateway.workspace / "src").mkdir()
    (gateway.workspace / "src/app.py").write_text("def main():\n    return 'TODO'\n")
    returns: list[tuple[str, Any]] = []
    model = scripted(
        [
            [("view", {"file_path": "README.md"})],
            [("edit", {"file_path": "README.md", "old_string": "version = 1", "new_string": "version = 2"})],
            [("write", {"file_path": "/workspace/main/notes/plan.txt", "content": "ship it\n"})],
            [("grep", {"pattern": "TODO"})],
            [("glob", {"pattern": "**/*.py"})],
            [("ls", {"path": "."})],
            [("shell_exec", {"command": "cat README.md | wc -l; echo $PWD"})],
            [("shell_exec", {"command": "cat /etc/hostname", "cwd": "/etc"})],
        ],
        returns,
    )
    run_id = await run_agent(client, model)
    by_tool: dict[str, list[Any]] = {}
    for name, content in returns:
        by_tool.setdefault(name, []).append(content)

    assert "version = 1" in json.dumps(by_tool["view"][0])
    assert (gateway.workspace / "README.md").read_text() == "# demo\nversion = 2\n"
    assert (gateway.workspace / "notes/plan.txt").read_text() == "ship it\n"
    assert "app.py" in json.dumps(by_tool["grep"][0]) and "TODO" in json.dumps(by_tool["grep"][0])
    assert "src/app.py" in json.dumps(by_tool["glob"][0])
    listing = json.dumps(by_tool["ls"][0])
    assert "README.md" in listing and "src" in listing and "notes" in listing
    first, second = by_tool["shell_exec"]
    # Commands see the root at its host path (file tools: the virtual one).
    assert first["return_code"] == 0 and first["stdout"].split() == ["2", str(gateway.workspace)]
    # /etc is under no root: refused, and the agent is told so.
    assert "return_code" not in second or second["return_code"] != 0
    assert "/etc" in json.dumps(second)

    # Every action is in the audit log with the run's and tool call's ids.
    entries = gateway.audit("--run", run_id)
    methods = {e["method"] for e in entries}
    assert {"file.read", "file.write", "file.list", "shell.start"} <= methods, methods
    assert all(e["context"]["tool_call_id"].startswith("call-") for e in entries)
    assert any(e["context"]["tool_call_id"] == "call-6-0" and e["method"] == "shell.start" for e in entries)


async def test_background_processes(client: portcullis.Client) -> None:
    returns: list[tuple[str, Any]] = []
    model = scripted(
        [
            [("shell_exec", {"command": "read x; echo got $x; sleep 30", "background": True})],
            [("shell_input", {"process_id": "process-1", "text": "hello\n"})],
            [("shell_wait", {"process_id": "process-1", "timeout_seconds": 2})],
            [("shell_kill", {"process_id": "process-1"})],
        ],
        returns,
    )
    await run_agent(client, model)
    by_tool = {name: content for name, content in returns}
    assert "process-1" in json.dumps(by_tool["shell_exec"])
    assert "got hello" in json.dumps(by_tool["shell_wait"])
    assert "process-1" in json.dumps(by_tool["shell_kill"])
    # The gateway process is gone.
    await asyncio.sleep(0.5)
    assert all(p["state"] != "running" for p in await client.shell.list())


async def test_refusals_surface_as_the_sdks_errors(client: portcullis.Client, gateway: Gateway) -> None:
    files = PortcullisFileOperator(client)
    with pytest.raises(PathNotAllowedError):
        await files.read_file("/etc/passwd")
    with pytest.raises(PathNotAllowedError):
        await files.read_file("../../etc/passwd")
    with pytest.raises(FileOperationError, match="file not found"):
        await files.read_file("missing.txt")
    assert not await files.exists("/etc/passwd")
    async with PortcullisEnvironment(client=client) as env:
        assert env.shell is not None
        with pytest.raises(ShellExecutionError, match="under no root"):
            await env.shell.execute("true", cwd="/etc")
        code, out, _ = await env.shell.execute("echo hi")
        assert (code, out) == (0, "hi\n")
        instructions = await env.get_context_instructions()
        assert "/workspace/main" in instructions and "portcullis" in instructions


async def test_streams_and_walk(client: portcullis.Client, gateway: Gateway) -> None:
    files = PortcullisFileOperator(client)

    async def pieces() -> Any:
        for i in range(4):
            yield bytes([65 + i]) * 70_000

    await files.write_bytes_stream("big/data.bin", pieces())
    expected = b"".join(bytes([65 + i]) * 70_000 for i in range(4))
    assert (gateway.workspace / "big/data.bin").read_bytes() == expected
    got = [p async for p in files.read_bytes_stream("big/data.bin", chunk_size=50_000)]
    assert b"".join(got) == expected and max(len(p) for p in got) <= 50_000
    walked = [e["path"] async for e in files.walk_files(".")]
    assert walked == ["big", "big/data.bin"]
    walked_abs = [e["path"] async for e in files.walk_files("/workspace/main")]
    assert walked_abs == ["/workspace/main/big", "/workspace/main/big/data.bin"]


async def test_a_timed_out_or_cancelled_command_ends_on_the_gateway(client: portcullis.Client) -> None:
    async with PortcullisEnvironment(client=client) as env:
        assert env.shell is not None
        with pytest.raises(ShellTimeoutError):
            await env.shell.execute("sleep 30", timeout=1)
        task = asyncio.create_task(env.shell.execute("sleep 31"))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def running() -> list[dict[str, Any]]:
        return [p for p in await client.shell.list() if p["state"] == "running"]

    for _ in range(50):
        if not await running():
            break
        await asyncio.sleep(0.2)
    assert not await running(), "a sleep outlived its timeout or cancellation"


async def test_the_resource_registry_is_the_gateways(client: portcullis.Client) -> None:
    async with PortcullisEnvironment(client=client) as env:
        resources = await env.resources.get_or_create("portcullis")
        watch = await client.files.watch("/workspace/main")
        assert any(r["id"] == watch.id for r in await resources.list())
        state = await env.export_resource_state()
        assert watch.id in state.model_dump_json()
        await resources.dispose(watch.id)
        assert all(r["id"] != watch.id for r in await resources.list())

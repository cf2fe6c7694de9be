"""An agent built with ya-agent-sdk whose files and shell are a gateway's.

    pip install './python[ya-agent]' ya-agent-sdk
    python examples/agent.py ws://127.0.0.1:7443 --gateway-key KEY --identity portcullis-demo/client.key \\
        --model anthropic:claude-sonnet-4-5 "Summarise README.md and count the Python files"

Every file and shell action the agent takes is decided by the gateway's
policy and written to its audit log with this run's ids:
`portcullis audit list --run RUN_ID` (the run id is printed at the end).
"""

from __future__ import annotations

import argparse
import asyncio

from pydantic_ai.capabilities import Toolset as ToolsetCapability
from ya_agent_sdk.agents.main import create_agent
from ya_agent_sdk.toolsets import Toolset
from ya_agent_sdk.toolsets.core.filesystem import tools as file_tools
from ya_agent_sdk.toolsets.core.shell import tools as shell_tools

from portcullis.ya_agent import PortcullisEnvironment


async def main(url: str, gateway_key: str | None, identity: str | None, model: str, task: str) -> None:
    environment = PortcullisEnvironment(url, gateway_key=gateway_key, identity=identity)
    runtime = create_agent(
        model,
        env=environment,
        capabilities=[ToolsetCapability(Toolset([*file_tools, *shell_tools]))],
    )
    async with runtime:
        result = await runtime.agent.run(task, deps=runtime.ctx)
        print(result.output)
        print(f"\naudit: portcullis audit list --run {runtime.ctx.run_id}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("task")
    parser.add_argument("--gateway-key")
    parser.add_argument("--identity")
    parser.add_argument("--model", required=True, help="a pydantic-ai model name, e.g. openai:gpt-5")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.gateway_key, args.identity, args.model, args.task))

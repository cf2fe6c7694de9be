"""The client API: connect, files, a command, a process, a tool.

    python examples/client.py ws://127.0.0.1:7443 --gateway-key KEY --identity portcullis-demo/client.key

(the demo gateway: `cargo run --release -- serve --demo` prints both).
"""

from __future__ import annotations

import argparse
import asyncio

import portcullis


async def main(url: str, gateway_key: str | None, identity: str | None) -> None:
    async with await portcullis.connect(url, gateway_key=gateway_key, identity=identity) as gw:
        root = gw.roots[0]
        print(f"connected as {gw.principal}; root {root.root_id} at {root.virtual_path} ({root.mode})")
        base = root.virtual_path or f"{root.root_id}:"
        await gw.files.write(f"{base}/hello.txt", "hello from Python\n")
        print(await gw.files.read_text(f"{base}/hello.txt"), end="")
        for entry in await gw.files.list(base):
            print(f"  {entry['kind']:4} {entry['size']:>8} {entry['name']}")
        result = await gw.shell.exec(["ls", "-la"], cwd=base)
        print(f"ls exited {result.exit_code}:\n{result.stdout}")
        process = await gw.shell.start(["sh", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.2; done"], cwd=base)
        async for piece in process.output():
            print(piece.stream, piece.data.decode(), end="")
        print("ended:", (await process.wait()).ended_by)
        try:
            await gw.files.read_text("/etc/shadow")
        except portcullis.InvalidRequest as refused:
            print("refused as expected:", refused)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--gateway-key")
    parser.add_argument("--identity")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.gateway_key, args.identity))

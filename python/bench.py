"""The Python client's figures for the benchmark harness
(`portcullis-bench --only python`, which runs the Rust client beside it on
the same gateway): exec `true` latency, download and upload throughput.
Prints one JSON object per run (one measure: the harness prepares the
page cache and the disk alike before each transfer). Not a test: it asserts nothing about timings."""

from __future__ import annotations

import argparse
import asyncio
import json

import statistics
import time
from pathlib import Path

import portcullis


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> dict[str, float]:
    client = await portcullis.connect(
        args.url, gateway_key=args.gateway_key, identity=args.identity, remember=False,
        config_dir=args.local_dir,
    )
    try:
        local = Path(args.local_dir)
        down = local / "python-down.bin"
        if args.what == "exec":
            latencies: list[float] = []
            # Not counted: a new process's first execs (its session's
            # first requests) are the slowest; the harness warms the Rust
            # client's session alike.
            for _ in range(args.warm_up):
                await client.shell.exec(["/bin/true"])
            for _ in range(args.samples):
                started = time.perf_counter()
                result = await client.shell.exec(["/bin/true"])
                latencies.append((time.perf_counter() - started) * 1000)
                if result.exit_code != 0:
                    raise SystemExit(f"/bin/true: {result.raw}")
            return {"exec_p50_ms": statistics.median(latencies), "exec_p99_ms": quantile(latencies, 0.99)}
        if args.what == "download":
            started = time.perf_counter()
            got = await client.files.download(args.remote, down)
            took = time.perf_counter() - started
            return {"download_mb_s": int(got["length"]) / took / 1e6}
        up_remote = args.remote.rsplit(":", 1)[0] + ":python-up.bin"
        size = down.stat().st_size
        started = time.perf_counter()
        await client.files.upload(down, up_remote)
        took = time.perf_counter() - started
        return {"upload_mb_s": size / took / 1e6}
    finally:
        await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--gateway-key", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warm-up", type=int, default=3, help="execs run first and not counted")
    parser.add_argument("--remote", required=True, help="ROOT:PATH of the file to download")
    parser.add_argument("--local-dir", required=True)
    parser.add_argument(
        "--what",
        choices=["exec", "download", "upload"],
        required=True,
        help="exec: --samples of exec true; download: --remote to LOCAL_DIR/python-down.bin; upload: that file back",
    )
    figures = asyncio.run(main(parser.parse_args()))
    print(json.dumps(figures))


"""Fixtures: a real gateway (the `portcullis` binary built by cargo) in a
temporary directory, and a client connected to it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import portcullis

REPO = Path(__file__).resolve().parents[2]

POLICY = """
[[principal]]
id = "alice"
public_key = "ALICE_KEY"

[[root]]
id = "main"
path = "GWDIR/workspace"
virtual_path = "/workspace/main"

[[tool]]
name = "greet"
description = "Greets someone"
risk = "low"
approval_policy = "allow"
script = "greet.rhai"
input_schema = { type = "object", properties = { name = { type = "string" } }, required = ["name"] }

[[grant]]
id = "alice"
principals = ["alice"]
fileops = { main = "rw" }
resources = {}
scripts = {}
tools = { allow = ["greet"] }

[grant.shell]
commands = ["sh", "true", "echo", "cat", "ls", "sleep", "grep", "find", "head", "wc", "rg"]
cwd_roots = ["main"]
env_set = { PATH = "/usr/local/bin:/usr/bin:/bin" }
pty = true
persist = true
"""


def binary() -> Path:
    found = os.environ.get("PORTCULLIS_BIN")
    path = Path(found) if found else REPO / "target" / "debug" / "portcullis"
    if not path.is_file():
        raise RuntimeError(
            f"{path} is missing: build the gateway first (cargo build --workspace), "
            "or set PORTCULLIS_BIN"
        )
    return path


@dataclass
class Gateway:
    dir: Path
    url: str
    key: str
    identity: Path
    process: subprocess.Popen[bytes]

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    async def connect(self, **kwargs: Any) -> portcullis.Client:
        kwargs.setdefault("gateway_key", self.key)
        kwargs.setdefault("identity", self.identity)
        kwargs.setdefault("config_dir", self.dir / "client-config")
        return await portcullis.connect(self.url, **kwargs)

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [str(binary()), *args, "--config", str(self.dir / "portcullis.toml")],
            capture_output=True,
            check=True,
        )
        return out.stdout.decode()

    def audit(self, *filters: str) -> list[dict[str, Any]]:
        """Audit entries, newest first (`portcullis audit list --json`)."""
        text = self.cli("audit", "list", "--json", "--limit", "100000", *filters)
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_gateway(policy: str = POLICY, extra_config: str = "") -> Gateway:
    base = Path(tempfile.mkdtemp(prefix="portcullis-py-"))
    (base / "workspace").mkdir()
    gateway_key = portcullis.generate_key(str(base / "gateway.key"))
    alice_key = portcullis.generate_key(str(base / "alice.key"))
    (base / "greet.rhai").write_text('"hello " + args.name')
    (base / "policy.toml").write_text(
        policy.replace("ALICE_KEY", alice_key).replace("GWDIR", str(base))
    )
    (base / "portcullis.toml").write_text(
        'listen = ["127.0.0.1:0"]\nkey_file = "gateway.key"\npolicy = "policy.toml"\n'
        f'state_dir = "state"\nadmin_socket = "admin.sock"\n{extra_config}\n'
    )
    stderr = open(base / "stderr.log", "ab")
    process = subprocess.Popen(
        [str(binary()), "serve", "--config", str(base / "portcullis.toml")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode().strip()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"gateway did not start: {line!r}\n{(base / 'stderr.log').read_text()}")
    addr = line.removeprefix("listening on ")
    return Gateway(base, f"ws://{addr}", gateway_key, base / "alice.key", process)


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    gw = start_gateway()
    try:
        yield gw
    finally:
        gw.stop()
        shutil.rmtree(gw.dir, ignore_errors=True)


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[portcullis.Client]:
    c = await gateway.connect()
    try:
        yield c
    finally:
        await c.close()

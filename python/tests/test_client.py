"""The client API end to end against the real gateway binary."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import portcullis
from conftest import Gateway


async def test_hello_roots_and_ping(client: portcullis.Client) -> None:
    assert client.principal == "alice"
    assert [r.root_id for r in client.roots] == ["main"]
    assert client.roots[0].virtual_path == "/workspace/main"
    assert client.locate("/workspace/main/a/b.txt") == ("main", "a/b.txt")
    assert client.locate("/workspace/main") == ("main", ".")
    assert client.locate("main:x") == ("main", "x")
    with pytest.raises(portcullis.InvalidRequest, match="/workspace/main"):
        client.locate("/etc/passwd")
    assert 0 < await client.ping() < 5


async def test_files_round_trip(client: portcullis.Client, gateway: Gateway) -> None:
    files = client.files
    await files.write("/workspace/main/notes/a.txt", "héllo\n", create_parents=True)
    assert (gateway.workspace / "notes/a.txt").read_text() == "héllo\n"
    await files.append("/workspace/main/notes/a.txt", b"\x00\xffmore")
    assert await files.read_bytes("main:notes/a.txt") == "héllo\n".encode() + b"\x00\xffmore"
    assert await files.read_text("/workspace/main/notes/a.txt", length=6) == "héllo"
    stat = await files.stat("/workspace/main/notes/a.txt")
    assert stat["kind"] == "file" and stat["size"] == len("héllo\n".encode()) + 6
    await files.mkdir("/workspace/main/notes/sub")
    await files.copy("/workspace/main/notes/a.txt", "/workspace/main/notes/sub/b.txt")
    await files.move("/workspace/main/notes/sub/b.txt", "/workspace/main/notes/c.txt")
    names = [e["name"] for e in await files.list("/workspace/main/notes")]
    assert names == ["a.txt", "c.txt", "sub"]
    deep = [e["path"] for e in await files.list("/workspace/main", depth=3)]
    assert "/workspace/main/notes/c.txt" in deep
    await files.write("/workspace/main/notes/d.txt", "héllo wörld\n")
    edited = await files.edit("/workspace/main/notes/d.txt", [{"old_text": "héllo", "new_text": "hi"}])
    assert edited["replacements"] == 1
    assert (gateway.workspace / "notes/d.txt").read_text() == "hi wörld\n"
    with pytest.raises(portcullis.InvalidRequest, match="not UTF-8"):
        await files.edit("/workspace/main/notes/c.txt", [{"old_text": "more", "new_text": "less"}])
    await files.delete("/workspace/main/notes/c.txt")
    assert not await files.exists("/workspace/main/notes/c.txt")
    assert await files.exists("/workspace/main/notes/a.txt")
    with pytest.raises(portcullis.InvalidRequest) as refused:
        await files.delete("/workspace/main/notes")  # not empty
    assert refused.value.code == "invalid_request"
    await files.delete("/workspace/main/notes", recursive=True)
    assert not (gateway.workspace / "notes").exists()


async def test_large_write_streams(client: portcullis.Client, gateway: Gateway) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    result = await client.files.write("/workspace/main/big.bin", data)
    assert result["sha256"] == hashlib.sha256(data).hexdigest()
    assert (gateway.workspace / "big.bin").read_bytes() == data
    assert await client.files.read_bytes("/workspace/main/big.bin") == data

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(5):
            yield bytes([i]) * 100_000

    await client.files.write_stream("/workspace/main/streamed.bin", pieces())
    got = b"".join([p async for p in client.files.read_stream("/workspace/main/streamed.bin")])
    assert got == b"".join(bytes([i]) * 100_000 for i in range(5))


async def test_download_upload_with_progress(
    client: portcullis.Client, gateway: Gateway, tmp_path: Path
) -> None:
    data = os.urandom(5 * 1024 * 1024)
    local = tmp_path / "up.bin"
    local.write_bytes(data)
    seen: list[int] = []
    result = await client.files.upload(local, "/workspace/main/up.bin", progress=seen.append)
    assert result["sha256"] == hashlib.sha256(data).hexdigest()
    assert seen and seen[-1] == len(data)
    assert (gateway.workspace / "up.bin").read_bytes() == data
    down = tmp_path / "down.bin"
    seen.clear()
    result = await client.files.download("/workspace/main/up.bin", down, progress=seen.append)
    assert down.read_bytes() == data
    assert result["sha256"] == hashlib.sha256(data).hexdigest()
    assert seen[-1] == len(data)
    with pytest.raises(portcullis.LocalError):
        await client.files.upload(tmp_path / "missing", "/workspace/main/x")


async def test_search(client: portcullis.Client) -> None:
    await client.files.write("/workspace/main/src/a.py", "import os\nTODO: one\n", create_parents=True)
    await client.files.write("/workspace/main/src/b.rs", "// TODO two\nfn main() {}\n")
    matches, summary = await client.files.search("TODO", "/workspace/main", globs=["*.py"])
    assert [(m["path"], m["line"]) for m in matches] == [("/workspace/main/src/a.py", 2)]
    assert summary["matches"] == 1 and summary["files_matched"] == 1


async def test_watch(client: portcullis.Client) -> None:
    await client.files.mkdir("/workspace/main/w")
    async with await client.files.watch("/workspace/main/w") as watch:
        await client.files.write("/workspace/main/w/new.txt", "x")

        async def first_change_of_new() -> dict[str, object]:
            # The atomic write's temporary file comes and goes first.
            async for change in watch:
                if change["path"] == "/workspace/main/w/new.txt":
                    return change
            raise AssertionError("the events ended")

        change = await asyncio.wait_for(first_change_of_new(), 10)
        assert change["kind"] in ("created", "modified", "moved_to")
    assert not any(r["id"] == watch.id for r in await client.resources.list())


async def test_exec(client: portcullis.Client) -> None:
    result = await client.shell.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], cwd="/workspace/main")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.ok
    result = await client.shell.exec(["cat"], stdin="piped")
    assert result.stdout == "piped"
    with pytest.raises(portcullis.PermissionDenied) as denied:
        await client.shell.exec(["python3", "-c", "1"])
    assert denied.value.code == "permission_denied"
    with pytest.raises(portcullis.Timeout) as timed_out:
        await client.shell.exec(["sh", "-c", "echo before; sleep 30"], timeout=0.5)
    assert timed_out.value.details["stdout"] == "before\n"


async def test_process(client: portcullis.Client) -> None:
    process = await client.shell.start(["sh", "-c", "read line; echo got $line; echo bye >&2"])
    assert process.id and process.pid
    await process.write("hello\n")
    out = [o async for o in process.output()]
    assert b"".join(o.data for o in out if o.stream == "stdout") == b"got hello\n"
    assert b"".join(o.data for o in out if o.stream == "stderr") == b"bye\n"
    ended = await process.wait()
    assert (ended.exit_code, ended.ended_by) == (0, "exit")


async def test_process_signal_kill_and_attach(client: portcullis.Client, gateway: Gateway) -> None:
    process = await client.shell.start(["sh", "-c", "echo ready; exec sleep 60"])
    await process.signal("TERM")
    ended = await process.wait()
    assert ended.signal == "SIGTERM"

    process = await client.shell.start(["sh", "-c", "echo one; echo two; exec sleep 60"])
    first = await anext(process.output())
    assert first.data.startswith(b"one")
    # Another connection follows the same (persistent) process from 0.
    async with await gateway.connect() as other:
        again = await other.shell.attach(process.id, from_seq=0)
        replay = b""
        async for piece in again.output():
            replay += piece.data
            if b"two\n" in replay:
                break
        assert replay == b"one\ntwo\n"
        await again.kill()
        assert (await again.wait()).ended_by == "cancelled"
    assert (await process.wait()).ended_by == "cancelled"


async def test_terminal(client: portcullis.Client) -> None:
    process = await client.shell.start(["sh"], pty=True, cols=100, rows=30)
    await process.write("stty size; exit\n")
    seen = b""
    async for piece in process.output():
        assert piece.stream == "terminal"
        seen += piece.data
    assert b"30 100" in seen
    await process.wait()


async def test_tools_scripts_and_events(client: portcullis.Client) -> None:
    tools = await client.tools.list()
    assert [t["name"] for t in tools] == ["greet"]
    assert await client.tools.call("greet", {"name": "ada"}) == "hello ada"
    with pytest.raises(portcullis.InvalidRequest) as bad:
        await client.tools.call("greet", {"name": 3})
    assert bad.value.details["errors"]
    with pytest.raises(portcullis.PermissionDenied):
        await client.tools.call("nope")  # no grant names it
    printed: list[str] = []
    result = await client.scripts.run(
        'print("a"); print(args.x); call_tool("greet", #{name: "bo"})', {"x": 2}, on_print=printed.append
    )
    assert result["value"] == "hello bo"
    assert printed == ["a\n", "2\n"]
    # A process's exit is an event on the session that started it.
    process = await client.shell.start(["true"])
    await process.wait()
    while (event := await client.next_event(10)) is not None:
        if event.event == "process.exited" and event.payload["process_id"] == process.id:
            break
    assert event is not None


async def test_cancelling_the_awaiting_task_cancels_the_request(
    client: portcullis.Client, gateway: Gateway
) -> None:
    task = asyncio.create_task(client.shell.exec(["sleep", "30"]))
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The gateway heard `cancel`: the request's audit entry says so.
    for _ in range(50):
        entries = gateway.audit("--method", "shell.exec", "--status", "cancelled")
        if entries:
            break
        await asyncio.sleep(0.2)
    assert entries, "no cancelled shell.exec in the audit log"
    assert await client.ping() > 0  # the connection is fine


async def test_context_reaches_the_audit_log(client: portcullis.Client, gateway: Gateway) -> None:
    with portcullis.runtime_context(session_id="s-1", run_id="run-42", tool_call_id="call-7"):
        await client.files.write("/workspace/main/ctx.txt", "x")
    entries = gateway.audit("--run", "run-42")
    assert entries and all(e["context"]["tool_call_id"] == "call-7" for e in entries)
    assert {e["method"] for e in entries} == {"file.write"}


async def test_refusals_and_bad_keys(gateway: Gateway, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger.key"
    portcullis.generate_key(str(stranger))
    with pytest.raises(portcullis.PortcullisError):
        await gateway.connect(identity=stranger)
    wrong = tmp_path / "wrong.key"
    with pytest.raises(portcullis.ConnectError):
        await gateway.connect(gateway_key=portcullis.generate_key(str(wrong)))
    with pytest.raises(ValueError, match="gateway_key"):
        await gateway.connect(gateway_key="not a key")


async def test_remembered_gateway_key(gateway: Gateway) -> None:
    first = await gateway.connect()
    await first.close()
    # The key was remembered in config_dir; the URL is enough now.
    again = await portcullis.connect(
        gateway.url, identity=gateway.identity, config_dir=gateway.dir / "client-config"
    )
    assert again.principal == "alice"
    await again.close()


async def test_reconnect_after_restart(gateway: Gateway) -> None:
    client = await gateway.connect()
    process = await client.shell.start(["sh", "-c", "echo kept; exec sleep 60"])
    await anext(process.output())
    await client.close()
    with pytest.raises(portcullis.Disconnected):
        await client.ping()
    # A new connection sees the persistent process and follows it.
    client = await gateway.connect()
    assert any(p["process_id"] == process.id for p in await client.shell.list())
    followed = await client.shell.attach(process.id, from_seq=0)
    assert (await anext(followed.output())).data == b"kept\n"
    await followed.kill()
    await client.close()


async def test_listen_accepts_a_dialing_gateway(tmp_path: Path) -> None:
    from conftest import POLICY, start_gateway

    listener = await portcullis.listen("127.0.0.1:0", token="relay-token-1234567890")
    token_file = tmp_path / "token"
    token_file.write_text("relay-token-1234567890")
    token_file.chmod(0o600)
    gw = start_gateway(
        POLICY,
        f'[[relay]]\nurl = "ws://{listener.address}/api/v1/relay/connect"\ntoken_file = "{token_file}"\n',
    )
    try:
        client = await listener.accept(gateway_key=gw.key, identity=gw.identity, timeout=20)
        assert client.principal == "alice"
        result = await client.shell.exec(["echo", "dialed"])
        assert result.stdout == "dialed\n"
        await client.close()
    finally:
        gw.stop()


async def test_token_authentication(tmp_path: Path) -> None:
    import hashlib as h

    from conftest import POLICY, start_gateway

    token = "pc-python-token-0123456789abcdef"
    digest = h.sha256(token.encode()).hexdigest()
    policy = POLICY.replace(
        '[[grant]]\nid = "alice"',
        f'[[principal]]\nid = "bot"\ntoken_hash = "sha256:{digest}"\n\n'
        '[[grant]]\nid = "bot"\nprincipals = ["bot"]\nresources = {}\n\n'
        '[[grant]]\nid = "alice"',
    )
    gw = start_gateway(policy)
    try:
        client = await portcullis.connect(
            gw.url, gateway_key=gw.key, token=token, config_dir=tmp_path, remember=False
        )
        assert client.principal == "bot"
        assert "fileops" not in client.capabilities
        await client.close()
        with pytest.raises(portcullis.PortcullisError):
            await portcullis.connect(
                gw.url, gateway_key=gw.key, token=token + "x", config_dir=tmp_path, remember=False
            )
    finally:
        gw.stop()


async def test_list_reads_every_page(client: portcullis.Client, gateway: Gateway) -> None:
    many = gateway.workspace / "many"
    many.mkdir()
    for i in range(1234):
        (many / f"f{i:04}").write_text("")
    names = [e["name"] for e in await client.files.list("/workspace/main/many")]
    assert names == [f"f{i:04}" for i in range(1234)]


async def test_tls(tmp_path: Path) -> None:
    import subprocess

    from conftest import POLICY, start_gateway

    ca_key, ca, key, csr, cert = (tmp_path / n for n in ("ca.key", "ca.pem", "gw.key", "gw.csr", "gw.pem"))

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "1", "-subj", "/CN=test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext = tmp_path / "ext.cnf"
    ext.write_text("subjectAltName = IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "1", "-extfile", str(ext))
    gw = start_gateway(POLICY, f'[tls]\ncert = "{cert}"\nkey = "{key}"\n')
    try:
        secure = gw.url.replace("ws://", "wss://")
        client = await portcullis.connect(
            secure, gateway_key=gw.key, identity=gw.identity, tls_ca=ca, config_dir=tmp_path, remember=False
        )
        assert (await client.shell.exec(["echo", "over tls"])).stdout == "over tls\n"
        await client.close()
        with pytest.raises(portcullis.ConnectError, match="tls_ca|CA"):
            await portcullis.connect(secure, gateway_key=gw.key, identity=gw.identity, config_dir=tmp_path)
        other = tmp_path / "other.pem"
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "o.key"), "-out",
            str(other), "-days", "1", "-subj", "/CN=other")
        with pytest.raises(portcullis.ConnectError):
            await portcullis.connect(
                secure, gateway_key=gw.key, identity=gw.identity, tls_ca=other, config_dir=tmp_path
            )
    finally:
        gw.stop()


async def test_resize_a_terminal(client: portcullis.Client) -> None:
    process = await client.shell.start(["sh"], pty=True, cols=80, rows=24)
    await process.resize(132, 40)
    await process.write("stty size; exit\n")
    seen = b"".join([piece.data async for piece in process.output()])
    assert b"40 132" in seen


EXIT_SCRIPT = """
import asyncio, sys
import portcullis

async def main() -> None:
    gw = await portcullis.connect(sys.argv[1], gateway_key=sys.argv[2], identity=sys.argv[3], config_dir=sys.argv[4])
    for _ in range(5):
        await gw.shell.exec(["true"])
    await gw.close()

asyncio.run(main())
"""


def test_the_interpreter_exits_cleanly_after_its_work(gateway: Gateway) -> None:
    # A tokio thread handing a result to asyncio while the interpreter
    # finalized aborted about one process in twenty (SIGABRT, exit 134)
    # before the module waited for such hand-overs at exit.
    import subprocess
    import sys

    config_dir = gateway.dir / "client-config"
    aborted = []
    for _ in range(30):
        run = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, gateway.url, gateway.key, str(gateway.identity), str(config_dir)],
            capture_output=True,
            timeout=60,
        )
        if run.returncode != 0:
            aborted.append((run.returncode, run.stderr.decode()[-500:]))
    assert aborted == []

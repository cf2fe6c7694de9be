"""The asyncio client: a connection to a gateway and its method families.

Every method is one relay request (docs/PROTOCOL.md in the repository):
decided by the gateway's policy, audited, then answered. The wire, the
Noise channel, key pinning and key files are the Rust client's
(``portcullis._native``); this module shapes its answers for Python.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import contextvars
import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from . import _native
from .errors import InvalidRequest, LocalError, NotFound, PortcullisError, ProtocolError

__all__ = [
    "Client",
    "Call",
    "Context",
    "Event",
    "ExecResult",
    "Process",
    "ProcessResult",
    "Output",
    "Root",
    "Watch",
    "runtime_context",
    "connect",
    "listen",
    "Listener",
]

#: Files up to this size are written in one frame; larger ones stream.
INLINE_WRITE_MAX = 1 << 20
#: Bytes per chunk a streamed write sends (one record holds a little less
#: than 64 KiB; the native side splits larger pieces).
STREAM_PIECE = 256 * 1024


@dataclass(frozen=True)
class Context:
    """The agent run a request belongs to; the gateway writes it into the
    request's audit entry (``session_id``, ``run_id``, ``tool_call_id``)."""

    session_id: str | None = None
    run_id: str | None = None
    tool_call_id: str | None = None
    workspace_id: str | None = None

    def to_json(self) -> str | None:
        fields = {k: v for k, v in self.__dict__.items() if v is not None}
        return json.dumps(fields) if fields else None


_CONTEXT: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "portcullis_context", default=None
)


@contextlib.contextmanager
def runtime_context(
    session_id: str | None = None,
    run_id: str | None = None,
    tool_call_id: str | None = None,
    workspace_id: str | None = None,
) -> Iterator[Context]:
    """Requests made inside this block (in this task and tasks it starts)
    carry this context, unless the client was given one of its own."""
    context = Context(session_id, run_id, tool_call_id, workspace_id)
    token = _CONTEXT.set(context)
    try:
        yield context
    finally:
        _CONTEXT.reset(token)


@dataclass(frozen=True)
class Root:
    """A root the gateway grants: ``root_id``, and the path the agent sees
    (``virtual_path``, e.g. ``/workspace/main``)."""

    root_id: str
    virtual_path: str | None
    mode: str
    label: str | None = None


@dataclass(frozen=True)
class Event:
    """An event from the gateway (``file.changed``, ``process.exited``, …)."""

    event: str
    payload: Any


@dataclass(frozen=True)
class Output:
    """A piece of a process's output: ``stream`` is ``stdout``, ``stderr``
    or ``terminal``."""

    stream: str
    data: bytes


@dataclass(frozen=True)
class ExecResult:
    """What ``shell.exec`` answered."""

    exit_code: int | None
    stdout: str
    stderr: str
    signal: str | None
    duration_ms: int
    stdout_truncated: bool
    stderr_truncated: bool
    raw: dict[str, Any] = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class ProcessResult:
    """How a started process ended."""

    exit_code: int | None
    signal: str | None
    ended_by: str | None
    duration_ms: int | None
    raw: dict[str, Any] = field(repr=False)


class Call:
    """A request in flight: read its stream, send it chunks, await its
    result, or cancel it. Dropping an unanswered call cancels it."""

    def __init__(self, native: _native.Call) -> None:
        self._native = native

    @property
    def id(self) -> str:
        return self._native.id

    async def next(self) -> tuple[str, str, Any] | None:
        """The next stream item: ``("stream", event, data)`` with ``data``
        parsed JSON, or ``("chunk", channel, bytes)``; None at the end."""
        item = await self._native.next()
        if item is None:
            return None
        kind, name, data = item
        if kind == "stream":
            return kind, name, json.loads(data)
        return kind, name, data

    def __aiter__(self) -> AsyncIterator[tuple[str, str, Any]]:
        return self._items()

    async def _items(self) -> AsyncIterator[tuple[str, str, Any]]:
        while (item := await self.next()) is not None:
            yield item

    async def send(self, data: bytes, channel: Literal["stdin", "file"] = "file") -> None:
        """Sends ``data`` as chunks; ``b""`` ends the input."""
        await self._native.send(channel, data)

    async def result(self) -> Any:
        """The answer (unread stream items are dropped from now on).
        Raises the error class of the gateway's error code."""
        return json.loads(await self._native.result())

    def cancel(self) -> None:
        """Asks the gateway to stop; the answer will be ``Cancelled``."""
        self._native.cancel()


class _Family:
    def __init__(self, client: Client) -> None:
        self._client = client


class Files(_Family):
    """``file.*``. A path is a virtual path the hello announced
    (``/workspace/main/src/app.py``) or ``ROOT:PATH`` (``main:src/app.py``)."""

    async def read_text(
        self, path: str, *, offset: int = 0, length: int | None = None, encoding: str = "utf-8"
    ) -> str:
        return (await self.read_bytes(path, offset=offset, length=length)).decode(encoding)

    async def read_bytes(self, path: str, *, offset: int = 0, length: int | None = None) -> bytes:
        pieces = [piece async for piece in self.read_stream(path, offset=offset, length=length)]
        return b"".join(pieces)

    async def read_stream(
        self, path: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """The file's bytes as they arrive (streamed, any size)."""
        root, rel = self._client.locate(path)
        params: dict[str, Any] = {
            "root_id": root,
            "path": rel,
            "stream": True,
            "sha256": False,
            "offset": offset,
        }
        if length is not None:
            params["length"] = length
        call = await self._client.call("file.read", params)
        async for kind, _name, data in call:
            if kind == "chunk":
                yield data
        await call.result()

    async def write(
        self,
        path: str,
        content: str | bytes,
        *,
        create_parents: bool = False,
        encoding: str = "utf-8",
    ) -> dict[str, Any]:
        """Writes the whole file atomically."""
        data = content.encode(encoding) if isinstance(content, str) else content
        return await self._put("file.write", path, data, create_parents)

    async def append(self, path: str, content: str | bytes, *, encoding: str = "utf-8") -> dict[str, Any]:
        data = content.encode(encoding) if isinstance(content, str) else content
        return await self._put("file.append", path, data, False)

    async def _put(self, method: str, path: str, data: bytes, create_parents: bool) -> dict[str, Any]:
        root, rel = self._client.locate(path)
        params: dict[str, Any] = {"root_id": root, "path": rel, "create_parents": create_parents}
        if len(data) <= INLINE_WRITE_MAX:
            params.update(content=base64.b64encode(data).decode("ascii"), encoding="base64")
            result: dict[str, Any] = await self._client.request(method, params)
            return result
        return await self._stream_in(method, params, _pieces(data))

    async def write_stream(
        self, path: str, stream: AsyncIterable[bytes], *, create_parents: bool = False
    ) -> dict[str, Any]:
        """Writes what ``stream`` yields, as it comes (atomically)."""
        root, rel = self._client.locate(path)
        params = {"root_id": root, "path": rel, "create_parents": create_parents}
        return await self._stream_in("file.write", params, stream)

    async def _stream_in(
        self, method: str, params: dict[str, Any], stream: AsyncIterable[bytes]
    ) -> dict[str, Any]:
        call = await self._client.call(method, {**params, "stream": True})
        try:
            async for piece in stream:
                if piece:
                    await call.send(piece)
            await call.send(b"")
        except BaseException:
            call.cancel()
            raise
        result: dict[str, Any] = await call.result()
        return result

    async def list(
        self, path: str, *, depth: int = 1, hidden: bool = False
    ) -> list[dict[str, Any]]:
        """Every entry below ``path`` (all pages), sorted by name."""
        root, rel = self._client.locate(path)
        entries: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = await self._client.request(
                "file.list",
                {"root_id": root, "path": rel, "depth": depth, "hidden": hidden, "offset": offset},
            )
            entries.extend(page["entries"])
            if not page.get("truncated") or page.get("next_offset") is None:
                return entries
            if not isinstance(page["next_offset"], int) or page["next_offset"] <= offset:
                raise ProtocolError(f"file.list: next_offset {page['next_offset']!r} does not move on")
            offset = page["next_offset"]

    async def stat(self, path: str) -> dict[str, Any]:
        root, rel = self._client.locate(path)
        result: dict[str, Any] = await self._client.request("file.stat", {"root_id": root, "path": rel})
        return result

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def edit(self, path: str, edits: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Replaces exact text in a UTF-8 file (``file.edit``): each of
        ``edits`` is ``{"old_text", "new_text", "replace_all"?}``, applied
        in order; all or none, written atomically. Returns ``{path, size,
        sha256, replacements}``."""
        root, rel = self._client.locate(path)
        result: dict[str, Any] = await self._client.request(
            "file.edit", {"root_id": root, "path": rel, "edits": [dict(e) for e in edits]}
        )
        return result

    async def mkdir(self, path: str, *, parents: bool = False) -> dict[str, Any]:
        root, rel = self._client.locate(path)
        result: dict[str, Any] = await self._client.request(
            "file.mkdir", {"root_id": root, "path": rel, "parents": parents}
        )
        return result

    async def delete(self, path: str, *, recursive: bool = False) -> dict[str, Any]:
        root, rel = self._client.locate(path)
        result: dict[str, Any] = await self._client.request(
            "file.delete", {"root_id": root, "path": rel, "recursive": recursive}
        )
        return result

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> dict[str, Any]:
        return await self._two("file.move", src, dst, overwrite)

    async def copy(self, src: str, dst: str, *, overwrite: bool = False) -> dict[str, Any]:
        return await self._two("file.copy", src, dst, overwrite)

    async def _two(self, method: str, src: str, dst: str, overwrite: bool) -> dict[str, Any]:
        (root, rel), (to_root, to_rel) = self._client.locate(src), self._client.locate(dst)
        result: dict[str, Any] = await self._client.request(
            method,
            {"root_id": root, "path": rel, "to_root_id": to_root, "to_path": to_rel, "overwrite": overwrite},
        )
        return result

    async def search(
        self,
        pattern: str,
        path: str,
        *,
        literal: bool = False,
        case_insensitive: bool = False,
        globs: Sequence[str] = (),
        hidden: bool = False,
        max_results: int = 1000,
    ) -> tuple[builtins.list[dict[str, Any]], dict[str, Any]]:
        """Matching lines (``{path, line, column, text}``) and the summary."""
        root, rel = self._client.locate(path)
        call = await self._client.call(
            "file.search",
            {
                "root_id": root,
                "path": rel,
                "pattern": pattern,
                "literal": literal,
                "case_insensitive": case_insensitive,
                "globs": list(globs),
                "hidden": hidden,
                "max_results": max_results,
            },
        )
        matches = [data async for kind, name, data in call if kind == "stream" and name == "match"]
        summary: dict[str, Any] = await call.result()
        return matches, summary

    async def watch(self, path: str, *, recursive: bool = False) -> Watch:
        """A watch: iterate it for ``file.changed`` events; ``close()``
        (or ``async with``) disposes it."""
        root, rel = self._client.locate(path)
        result = await self._client.request(
            "file.watch", {"root_id": root, "path": rel, "recursive": recursive}
        )
        return Watch(self._client, result)

    async def download(
        self, path: str, local: str | Path, *, progress: Callable[[int], object] | None = None
    ) -> dict[str, Any]:
        """Streams the file into the local file ``local`` (written by the
        native side: the bytes never pass through Python)."""
        root, rel = self._client.locate(path)
        text = await self._client._native.download(root, rel, str(local), True, progress)
        result: dict[str, Any] = json.loads(text)
        return result

    async def upload(
        self,
        local: str | Path,
        path: str,
        *,
        append: bool = False,
        progress: Callable[[int], object] | None = None,
    ) -> dict[str, Any]:
        """Streams the local file ``local`` to ``path`` (atomic unless
        ``append``)."""
        root, rel = self._client.locate(path)
        text = await self._client._native.upload(str(local), root, rel, append, True, progress)
        result: dict[str, Any] = json.loads(text)
        return result


def _pieces(data: bytes) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        view = memoryview(data)
        for start in range(0, len(view), STREAM_PIECE):
            yield bytes(view[start : start + STREAM_PIECE])

    return gen()


class Watch:
    """A ``file.watch``: an async iterator of its ``file.changed`` events."""

    def __init__(self, client: Client, result: dict[str, Any]) -> None:
        self._client = client
        self.id: str = result["watch"]
        self.result = result

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[dict[str, Any]]:
        async for event in self._client.events():
            if event.event == "file.changed" and event.payload.get("watch") == self.id:
                yield event.payload

    async def close(self) -> None:
        with contextlib.suppress(NotFound):
            await self._client.request("resource.dispose", {"id": self.id})

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Shell(_Family):
    """``shell.*``: a command is its argv; ``cwd`` is a path as in
    :class:`Files` (its root must be one the grant's ``cwd_roots`` list)."""

    def _params(
        self,
        command: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        timeout: float | None,
    ) -> dict[str, Any]:
        if isinstance(command, str):
            raise InvalidRequest("command is the program and its arguments, a list of strings")
        params: dict[str, Any] = {"command": list(command)}
        if cwd is not None:
            params["root_id"], params["cwd"] = self._client.locate(cwd)
        if env:
            params["env"] = dict(env)
        if timeout is not None:
            params["timeout_ms"] = max(1, int(timeout * 1000))
        return params

    async def exec(
        self,
        command: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Runs a command to its end. A non-zero exit is a result, not an
        error; the gateway's time limit raises ``Timeout`` (its ``details``
        hold the output so far)."""
        params = self._params(command, cwd, env, timeout)
        if stdin is not None:
            params["stdin"] = stdin
        raw: dict[str, Any] = await self._client.request("shell.exec", params)
        return ExecResult(
            exit_code=raw.get("exit_code"),
            stdout=raw.get("stdout", ""),
            stderr=raw.get("stderr", ""),
            signal=raw.get("signal"),
            duration_ms=raw.get("duration_ms", 0),
            stdout_truncated=raw.get("stdout_truncated", False),
            stderr_truncated=raw.get("stderr_truncated", False),
            raw=raw,
        )

    async def start(
        self,
        command: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        pty: bool = False,
        cols: int = 80,
        rows: int = 24,
    ) -> Process:
        """Starts a process; its output streams (``Process.output()``)."""
        params = self._params(command, cwd, env, timeout)
        if stdin is not None:
            params["stdin"] = stdin
        if pty:
            params.update(pty=True, cols=cols, rows=rows)
        call = await self._client.call("shell.start", params)
        return await Process._begin(self._client, call, "started")

    async def attach(self, process_id: str, *, from_seq: int | None = None) -> Process:
        """Follows a process again (persistent processes outlive their
        connection); output replays from ``from_seq`` (default the oldest
        kept)."""
        params: dict[str, Any] = {"process_id": process_id}
        if from_seq is not None:
            params["from_seq"] = from_seq
        call = await self._client.call("shell.attach", params)
        return await Process._begin(self._client, call, "attached")

    async def list(self) -> list[dict[str, Any]]:
        result = await self._client.request("shell.list", {})
        processes: list[dict[str, Any]] = result["processes"]
        return processes

    async def status(self, process_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._client.request("shell.status", {"process_id": process_id})
        return result


class Process:
    """A started (or attached) process."""

    def __init__(self, client: Client, call: Call, first: dict[str, Any]) -> None:
        self._client = client
        self._call = call
        self.id: str = first["process_id"]
        self.pid: int | None = first.get("pid")
        self.info = first
        self._result: ProcessResult | None = None
        self._ended = False

    @classmethod
    async def _begin(cls, client: Client, call: Call, first_event: str) -> Process:
        # The first frame names the process; an error answers instead.
        while (item := await call.next()) is not None:
            kind, name, data = item
            if kind == "stream" and name == first_event:
                return cls(client, call, data)
        await call.result()
        raise LocalError(f"the gateway answered without a `{first_event}` frame")

    async def output(self) -> AsyncIterator[Output]:
        """The output as it comes, until the process ends. Other stream
        frames (``status``, ``output_truncated``) are skipped."""
        while (item := await self._call.next()) is not None:
            kind, name, data = item
            if kind == "chunk":
                yield Output(name, data)
            elif name in ("stdout", "stderr"):
                raw = data if isinstance(data, str) else json.dumps(data)
                yield Output(name, raw.encode())
        self._ended = True

    async def wait(self) -> ProcessResult:
        """Waits for the process to end (output not yet read is dropped)."""
        if self._result is None:
            raw: dict[str, Any] = await self._call.result()
            self._result = ProcessResult(
                exit_code=raw.get("exit_code"),
                signal=raw.get("signal"),
                ended_by=raw.get("ended_by"),
                duration_ms=raw.get("duration_ms"),
                raw=raw,
            )
        return self._result

    async def write(self, data: str | bytes, *, eof: bool = False) -> None:
        params: dict[str, Any] = {"process_id": self.id, "eof": eof}
        if isinstance(data, bytes):
            params.update(data=base64.b64encode(data).decode("ascii"), encoding="base64")
        else:
            params["data"] = data
        await self._client.request("shell.input", params)

    async def close_stdin(self) -> None:
        await self.write("", eof=True)

    async def resize(self, cols: int, rows: int) -> None:
        await self._client.request("shell.resize", {"process_id": self.id, "cols": cols, "rows": rows})

    async def signal(self, signal: str) -> None:
        """Sends ``TERM``, ``INT``, ``KILL``, … to the process group."""
        await self._client.request("shell.signal", {"process_id": self.id, "signal": signal})

    async def kill(self) -> None:
        """Ends the process (``shell.cancel``): its group is killed."""
        await self._client.request("shell.cancel", {"process_id": self.id})

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._client.request("shell.status", {"process_id": self.id})
        return result

    def detach(self) -> None:
        """Stops following; a persistent process keeps running (attach
        again later), any other ends."""
        self._call.cancel()


class Tools(_Family):
    """The operator's tools (``tool.*``)."""

    async def list(self) -> list[dict[str, Any]]:
        result = await self._client.request("tool.list", {})
        tools: list[dict[str, Any]] = result["tools"]
        return tools

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
        """The tool's value. A tool that needs approval waits for the
        operator; denied, it raises ``ApprovalRequired``."""
        result = await self._client.request("tool.call", {"name": name, "arguments": dict(arguments or {})})
        return result["value"]


class Scripts(_Family):
    """Rhai scripts run on the gateway (``script.run``)."""

    async def run(
        self,
        source: str,
        args: Mapping[str, Any] | None = None,
        *,
        limits: Mapping[str, int] | None = None,
        on_print: Callable[[str], object] | None = None,
    ) -> dict[str, Any]:
        """Runs ``source``; ``on_print`` hears each ``print`` line as it
        comes. Returns ``{value, stats}``."""
        params: dict[str, Any] = {"source": source, "args": dict(args or {})}
        if limits:
            params["limits"] = dict(limits)
        call = await self._client.call("script.run", params)
        async for kind, name, data in call:
            if on_print is not None and kind == "stream" and name == "stdout":
                on_print(data if isinstance(data, str) else json.dumps(data))
        result: dict[str, Any] = await call.result()
        return result


class Resources(_Family):
    """``resource.*``: the session's watches and the principal's processes."""

    async def list(self) -> list[dict[str, Any]]:
        result = await self._client.request("resource.list", {})
        resources: list[dict[str, Any]] = result["resources"]
        return resources

    async def get(self, id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._client.request("resource.get", {"id": id})
        return result

    async def dispose(self, id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._client.request("resource.dispose", {"id": id})
        return result

    async def export_state(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._client.request("resource.export_state", {})
        return result

    async def restore_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._client.request("resource.restore_state", dict(state))
        return result


class Client:
    """A connection to a gateway. Make one with :func:`connect` (or
    :meth:`Listener.accept`); use it as ``async with``."""

    def __init__(self, native: _native.Client, *, context: Context | None = None) -> None:
        self._native = native
        self.context = context
        self.hello: dict[str, Any] = json.loads(native.hello)
        self.gateway_info: Any = json.loads(native.gateway_info)
        self.files = Files(self)
        self.shell = Shell(self)
        self.tools = Tools(self)
        self.scripts = Scripts(self)
        self.resources = Resources(self)

    @property
    def capabilities(self) -> dict[str, Any]:
        """What the hello offers, per capability."""
        capabilities: dict[str, Any] = self.hello.get("capabilities", {})
        return capabilities

    @property
    def principal(self) -> str | None:
        principal: str | None = self.hello.get("principal")
        return principal

    @property
    def roots(self) -> list[Root]:
        """The roots this principal was granted."""
        fileops = self.capabilities.get("fileops") or {}
        return [
            Root(r["root_id"], r.get("virtual_path"), r.get("mode", "ro"), r.get("label"))
            for r in fileops.get("roots", [])
        ]

    def locate(self, path: str) -> tuple[str, str]:
        """``(root_id, path in the root)`` for a virtual path or
        ``ROOT:PATH``. Raises ``InvalidRequest`` for a path under no root
        (the gateway would refuse it too; this says which roots exist)."""
        if not path.startswith("/"):
            root, sep, rel = path.partition(":")
            if sep and root:
                return root, rel or "."
        else:
            pure = PurePosixPath(path)
            best: tuple[Root, PurePosixPath] | None = None
            for root_ in self.roots:
                if root_.virtual_path is None:
                    continue
                base = PurePosixPath(root_.virtual_path)
                if (pure == base or base in pure.parents) and (
                    best is None or len(base.parts) > len(best[1].parts)
                ):
                    best = (root_, base)
            if best is not None:
                rel = pure.relative_to(best[1]).as_posix()
                return best[0].root_id, rel
        known = ", ".join(
            f"{r.virtual_path or r.root_id + ':'}" for r in self.roots
        ) or "none granted"
        raise InvalidRequest(f"`{path}` is under no root of this gateway (roots: {known})")

    def virtual_path(self, root_id: str, path: str) -> str:
        """The path the agent sees for ``path`` in ``root_id``."""
        for root in self.roots:
            if root.root_id == root_id and root.virtual_path:
                joined = PurePosixPath(root.virtual_path) / path
                return joined.as_posix() if path not in ("", ".") else root.virtual_path
        return f"{root_id}:{path}"

    def _context_json(self, context: Context | None) -> str | None:
        chosen = context or self.context or _CONTEXT.get()
        return chosen.to_json() if chosen is not None else None

    async def request(
        self, method: str, params: Mapping[str, Any] | None = None, *, context: Context | None = None
    ) -> Any:
        """Any relay request; its result. Cancelling the awaiting task
        sends ``cancel`` to the gateway."""
        text = await self._native.request(
            method, json.dumps(dict(params or {})), self._context_json(context)
        )
        return json.loads(text)

    async def call(
        self, method: str, params: Mapping[str, Any] | None = None, *, context: Context | None = None
    ) -> Call:
        """A request whose stream is read (or which is sent chunks)."""
        native = await self._native.start(
            method, json.dumps(dict(params or {})), self._context_json(context)
        )
        return Call(native)

    async def ping(self) -> float:
        """A relay ping's round trip, in seconds."""
        return await self._native.ping()

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event; None after ``timeout`` seconds. Raises
        ``Disconnected`` once the connection has ended."""
        text = await self._native.next_event(timeout)
        if text is None:
            return None
        raw = json.loads(text)
        return Event(raw["event"], raw.get("payload"))

    async def events(self) -> AsyncIterator[Event]:
        """Events as they come, until the connection ends. Events are one
        queue per connection: two readers share them."""
        while True:
            try:
                event = await self.next_event()
            except PortcullisError:
                return
            if event is not None:
                yield event

    @property
    def events_lost(self) -> int:
        return self._native.events_lost

    async def closed(self) -> str:
        """Resolves with the reason once the connection has ended."""
        return await self._native.closed()

    async def close(self) -> None:
        """Closes the connection (what the session started ends with it,
        but persistent processes)."""
        self._native.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(
    url: str,
    *,
    gateway_key: str | None = None,
    identity: str | Path | None = None,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    timeout: float = 10.0,
    config_dir: str | Path | None = None,
    remember: bool = True,
    capabilities: Sequence[str] | None = None,
    context: Context | None = None,
) -> Client:
    """Connects to the gateway at ``url`` (``ws://HOST:PORT`` or
    ``wss://…`` with ``tls_ca``) and accepts ``capabilities`` (default:
    all the hello offers).

    ``gateway_key`` (base64) pins the gateway: the handshake stops before
    any credential is sent if the gateway proves another key. Given once,
    it is remembered in ``~/.config/portcullis/gateways.toml`` (as the CLI
    does) unless ``remember=False``; later connections need only the URL.
    ``identity`` is this client's key file (default the CLI's
    ``identity.key``), or authenticate with a bearer ``token`` instead.
    """
    native = await _native.Client.connect(
        url,
        gateway_key,
        None if identity is None else str(identity),
        token,
        None if tls_ca is None else str(tls_ca),
        timeout,
        None if config_dir is None else str(config_dir),
        remember,
    )
    return await _accepted(native, capabilities, context)


async def _accepted(
    native: _native.Client, capabilities: Sequence[str] | None, context: Context | None
) -> Client:
    client = Client(native, context=context)
    names = list(capabilities) if capabilities is not None else list(client.capabilities)
    # No answer comes; frames are read in order, so requests after it
    # find the capabilities accepted.
    await native.accept(names, "chunks")
    return client


class Listener:
    """The runtime's side of dial-out: gateways with ``[[relay]]`` pointing
    here connect to it, present the bearer token, and are then used as
    from :func:`connect`."""

    def __init__(self, native: _native.Listener) -> None:
        self._native = native

    @property
    def address(self) -> str:
        return self._native.address

    async def accept(
        self,
        *,
        gateway_key: str,
        identity: str | Path | None = None,
        timeout: float = 10.0,
        capabilities: Sequence[str] | None = None,
        context: Context | None = None,
    ) -> Client:
        """The next gateway that dials in and proves ``gateway_key``."""
        native = await self._native.accept(
            gateway_key, None if identity is None else str(identity), timeout, None
        )
        return await _accepted(native, capabilities, context)


async def listen(address: str, *, token: str) -> Listener:
    """Listens on ``HOST:PORT`` for gateways that dial out to this runtime."""
    return Listener(await _native.Listener.bind(address, token))

"""A ya-agent-sdk ``Environment`` backed by a portcullis gateway.

``PortcullisEnvironment`` gives an agent built with ya-agent-sdk the
gateway's roots as its file system and the gateway's commands as its
shell, so the SDK's own toolsets (view, write, edit, ls, glob, grep,
shell_exec, …) run unchanged against the remote host — each action decided
by the gateway's policy and written to its audit log with the agent run's
ids (``session_id``, ``run_id``, ``tool_call_id``).

Paths are the roots' virtual paths (``/workspace/main/README.md``);
relative paths are taken from the first root (or ``default_root``).
Shell commands are strings run as ``sh -c COMMAND`` on the gateway, so the
grant must allow ``sh`` (and what the command runs). Install with the
``ya-agent`` extra: ``pip install './python[ya-agent]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import signal as signals
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from ya_agent_environment import Environment, FileOperator, Shell
from ya_agent_environment.exceptions import (
    FileOperationError,
    PathNotAllowedError,
    ShellExecutionError,
)
from ya_agent_environment.protocols import DEFAULT_CHUNK_SIZE
from ya_agent_environment.resources import BaseResource
from ya_agent_environment.shell import ExecutionHandle
from ya_agent_environment.types import FileEntry, FileStat

from .client import Client, Context, Process, connect, runtime_context
from .errors import NotFound, PermissionDenied, PolicyBlocked, PortcullisError

__all__ = [
    "PortcullisEnvironment",
    "PortcullisFileOperator",
    "PortcullisShell",
    "PortcullisResources",
    "run_context_capability",
]

T = TypeVar("T")

#: ``file.list`` walks at most this deep in one request.
MAX_LIST_DEPTH = 64


def _reason(error: PortcullisError) -> str:
    if isinstance(error, NotFound):
        return "file not found"
    if isinstance(error, (PermissionDenied, PolicyBlocked)):
        return f"permission denied: {error.message}"
    return str(error)


def _mtime(text: Any) -> float:
    if not isinstance(text, str):
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class PortcullisFileOperator(FileOperator):
    """The SDK's ``FileOperator`` over a gateway's ``file.*`` methods."""

    def __init__(self, client: Client, *, default_root: str | None = None, **kwargs: Any) -> None:
        roots = [r for r in client.roots if r.virtual_path]
        if not roots:
            raise ValueError("the gateway grants this principal no root with a virtual path")
        default = next((r for r in roots if r.root_id == default_root), roots[0])
        kwargs.setdefault("default_path", PurePosixPath(default.virtual_path or "/"))
        kwargs.setdefault("allowed_paths", [PurePosixPath(r.virtual_path or "/") for r in roots])
        super().__init__(**kwargs)
        self._client = client

    # -- paths --------------------------------------------------------

    def virtual(self, path: str) -> str:
        """The absolute virtual path for ``path`` (relative: from the
        default root)."""
        base = str(self._default_path or "/")
        joined = posixpath.normpath(posixpath.join(base, path or "."))
        return "/" + joined.lstrip("/")

    def _locate(self, path: str) -> tuple[str, str]:
        try:
            return self._client.locate(self.virtual(path))
        except PortcullisError:
            raise PathNotAllowedError(path, [str(p) for p in self._allowed_paths]) from None

    async def _run(self, operation: str, path: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except PortcullisError as error:
            raise FileOperationError(operation, path, _reason(error)) from error

    # -- the abstract methods -----------------------------------------

    async def read_file(
        self, path: str, *, encoding: str = "utf-8", offset: int = 0, length: int | None = None
    ) -> str:
        data = await self.read_bytes(path)
        text = data.decode(encoding)
        if offset > 0 or length is not None:
            text = text[offset : None if length is None else offset + length]
        return text

    async def read_bytes(self, path: str, *, offset: int = 0, length: int | None = None) -> bytes:
        self._locate(path)
        return await self._run(
            "read",
            path,
            lambda: self._client.files.read_bytes(self.virtual(path), offset=offset, length=length),
        )

    async def read_bytes_stream(
        self, path: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> AsyncIterator[bytes]:
        """The file as it streams in (``file.read`` with chunks), in pieces
        of at most ``chunk_size``."""
        if chunk_size <= 0:
            raise ValueError("chunk_size must be greater than zero")
        self._locate(path)
        try:
            async for piece in self._client.files.read_stream(self.virtual(path)):
                for start in range(0, len(piece), chunk_size):
                    yield piece[start : start + chunk_size]
        except PortcullisError as error:
            raise FileOperationError("read", path, _reason(error)) from error

    async def write_bytes_stream(self, path: str, stream: AsyncIterator[bytes]) -> None:
        """Streams ``stream`` into the file (atomic on the gateway)."""
        self._locate(path)
        await self._run(
            "write",
            path,
            lambda: self._client.files.write_stream(self.virtual(path), stream, create_parents=True),
        )

    async def write_file(self, path: str, content: str | bytes, *, encoding: str = "utf-8") -> None:
        self._locate(path)
        await self._run(
            "write",
            path,
            lambda: self._client.files.write(
                self.virtual(path), content, encoding=encoding, create_parents=True
            ),
        )

    async def append_file(self, path: str, content: str | bytes, *, encoding: str = "utf-8") -> None:
        self._locate(path)
        await self._run(
            "append", path, lambda: self._client.files.append(self.virtual(path), content, encoding=encoding)
        )

    async def delete(self, path: str) -> None:
        self._locate(path)
        await self._run("delete", path, lambda: self._client.files.delete(self.virtual(path)))

    async def list_dir(self, path: str) -> list[str]:
        return [name for name, _ in await self.list_dir_with_types(path)]

    async def list_dir_with_types(self, path: str) -> list[tuple[str, bool]]:
        """One ``file.list`` (hidden entries included, as ``os.listdir``)."""
        self._locate(path)
        entries = await self._run(
            "list", path, lambda: self._client.files.list(self.virtual(path), hidden=True)
        )
        return sorted((e["name"], e["kind"] == "dir") for e in entries)

    async def exists(self, path: str) -> bool:
        try:
            self._locate(path)
        except PathNotAllowedError:
            return False
        try:
            await self._client.files.stat(self.virtual(path))
        except NotFound:
            return False
        except PortcullisError as error:
            raise FileOperationError("stat", path, _reason(error)) from error
        return True

    async def is_file(self, path: str) -> bool:
        return await self._kind(path) == "file"

    async def is_dir(self, path: str) -> bool:
        return await self._kind(path) == "dir"

    async def _kind(self, path: str) -> str | None:
        try:
            self._locate(path)
            found = await self._client.files.stat(self.virtual(path))
        except (NotFound, PathNotAllowedError):
            return None
        except PortcullisError as error:
            raise FileOperationError("stat", path, _reason(error)) from error
        kind: str = found["kind"]
        return kind

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        self._locate(path)
        await self._run("mkdir", path, lambda: self._client.files.mkdir(self.virtual(path), parents=parents))

    async def move(self, src: str, dst: str) -> None:
        self._locate(src), self._locate(dst)
        await self._run("move", src, lambda: self._client.files.move(self.virtual(src), self.virtual(dst)))

    async def copy(self, src: str, dst: str) -> None:
        self._locate(src), self._locate(dst)
        await self._run("copy", src, lambda: self._client.files.copy(self.virtual(src), self.virtual(dst)))

    async def stat(self, path: str) -> FileStat:
        self._locate(path)
        found = await self._run("stat", path, lambda: self._client.files.stat(self.virtual(path)))
        return FileStat(
            size=int(found.get("size") or 0),
            mtime=_mtime(found.get("mtime")),
            is_file=found["kind"] == "file",
            is_dir=found["kind"] == "dir",
        )

    async def walk_files(
        self,
        root: str = ".",
        *,
        max_depth: int | None = None,
        include_hidden: bool = False,
        follow_symlinks: bool = False,
    ) -> AsyncIterator[FileEntry]:
        """The tree below ``root`` from one ``file.list`` with a depth (the
        base class would stat every entry: a request each). Symlinks are
        listed, never followed."""
        del follow_symlinks
        root = root if root not in {"", "."} else "."
        try:
            self._locate(root)
            top = await self._client.files.stat(self.virtual(root))
        except (PortcullisError, PathNotAllowedError):
            return
        relative = not root.startswith("/")
        base = self.virtual(".")

        def shown(virtual_path: str) -> str:
            if not relative:
                return virtual_path
            return posixpath.relpath(virtual_path, base)

        if top["kind"] == "file":
            yield FileEntry(
                path=root, is_file=True, is_dir=False, size=top.get("size"), mtime=_mtime(top.get("mtime"))
            )
            return
        if top["kind"] != "dir":
            return
        depth = MAX_LIST_DEPTH if max_depth is None else min(max(max_depth, 1), MAX_LIST_DEPTH)
        try:
            entries = await self._client.files.list(self.virtual(root), depth=depth, hidden=include_hidden)
        except PortcullisError:
            return
        for entry in entries:
            yield FileEntry(
                path=shown(entry["path"]),
                is_file=entry["kind"] == "file",
                is_dir=entry["kind"] == "dir",
                size=entry.get("size"),
                mtime=_mtime(entry.get("mtime")),
            )


class _StdinOfProcess:
    """The SDK's ``WritableStream`` over ``shell.input``."""

    def __init__(self, process: Process) -> None:
        self._process = process
        self._closed = False

    async def write(self, data: bytes) -> None:
        if self._closed:
            return
        await self._process.write(data)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(PortcullisError):
            await self._process.close_stdin()


class PortcullisShell(Shell):
    """The SDK's ``Shell`` over gateway processes (``shell.start``): a
    command is ``sh -c COMMAND``; its output streams into the SDK's
    readers; stdin, signals and kill act on the gateway process. With the
    grant's ``persist`` a background process outlives this connection and
    can be followed again with ``shell.attach``."""

    def __init__(
        self,
        client: Client,
        files: PortcullisFileOperator,
        *,
        shell: str = "sh",
        default_timeout: float = 30.0,
        skip_instructions: bool = False,
    ) -> None:
        super().__init__(default_timeout=default_timeout, skip_instructions=skip_instructions)
        self._client = client
        self._files = files
        self._shell = shell
        # The Shell base resolves paths on this machine; the gateway's are
        # virtual, so they are kept as they are.
        self._default_cwd = files._default_path
        self._allowed_paths = list(files._allowed_paths)

    async def _create_process(
        self, command: str, *, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> ExecutionHandle:
        if not command:
            raise ShellExecutionError("", stderr="Empty command")
        where = self._files.virtual(cwd or ".")
        try:
            process = await self._client.shell.start([self._shell, "-c", command], cwd=where, env=env)
        except PortcullisError as error:
            raise ShellExecutionError(command, stderr=str(error)) from error
        stdout, stderr = asyncio.StreamReader(), asyncio.StreamReader()

        async def pump() -> None:
            try:
                async for piece in process.output():
                    (stderr if piece.stream == "stderr" else stdout).feed_data(piece.data)
            finally:
                stdout.feed_eof()
                stderr.feed_eof()

        pumping = asyncio.create_task(pump(), name=f"portcullis-output-{process.id}")

        async def wait() -> int:
            await pumping
            ended = await process.wait()
            if ended.exit_code is not None:
                return ended.exit_code
            number = getattr(signals, ended.signal or "", None)
            return -int(number) if number is not None else -1

        async def kill() -> None:
            with contextlib.suppress(NotFound):
                await process.kill()

        async def send_signal(number: int) -> None:
            await process.signal(signals.Signals(number).name.removeprefix("SIG"))

        return ExecutionHandle(
            stdout=stdout,
            stderr=stderr,
            wait=wait,
            kill=kill,
            stdin=_StdinOfProcess(process),
            pid=process.pid,
            send_signal=send_signal,
        )

    async def get_context_instructions(self) -> str | None:
        if self._skip_instructions:
            return None
        roots = ", ".join(str(p) for p in self._allowed_paths)
        return (
            "<shell>\n"
            f"  Commands run on a remote host through a portcullis gateway, as `{self._shell} -c COMMAND`, "
            f"in the working directory {self._default_cwd} unless `cwd` says otherwise (one of: {roots}).\n"
            "  Only the programs the gateway's policy grants run; a refused command says so in its error. "
            "Nothing outside those directories is visible to commands.\n"
            "</shell>"
        )


class PortcullisResources(BaseResource):
    """The gateway's ``resource.*`` for the SDK's registry: the session's
    watches and the principal's processes, and their state across restarts
    (``export_state``/``restore_state``: running persistent processes are
    kept, others are reported lost)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def list(self) -> list[dict[str, Any]]:
        return await self._client.resources.list()

    async def dispose(self, resource_id: str) -> None:
        await self._client.resources.dispose(resource_id)

    async def export_state(self) -> dict[str, Any]:
        return await self._client.resources.export_state()

    async def restore_state(self, state: dict[str, Any]) -> None:
        if state:
            await self._client.resources.restore_state(state)

    async def close(self) -> None:
        return None


def run_context_capability() -> Any:
    """A pydantic-ai capability that makes every request a tool makes carry
    the agent run's ids (``ctx.deps.run_id``, the tool call's id, and the
    provider session id), so the gateway's audit log links to the run."""
    from pydantic_ai.capabilities import AbstractCapability

    class PortcullisRunContext(AbstractCapability[Any]):
        async def wrap_tool_execute(
            self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
        ) -> Any:
            deps = getattr(ctx, "deps", None)
            run_id = getattr(deps, "run_id", None)
            session_id = getattr(deps, "provider_session_id", None) or run_id
            with runtime_context(
                session_id=None if session_id is None else str(session_id),
                run_id=None if run_id is None else str(run_id),
                tool_call_id=getattr(call, "tool_call_id", None),
            ):
                return await handler(args)

    return PortcullisRunContext()


class PortcullisEnvironment(Environment):
    """An SDK ``Environment`` whose files and shell are a gateway's.

    Give it a connected :class:`portcullis.Client` (``client=``; it stays
    open after the environment exits), or what :func:`portcullis.connect`
    takes (``url=``, ``gateway_key=``, ``identity=``/``token=``, …; the
    connection is closed on exit)."""

    _file_operator: FileOperator | None
    _shell: Shell | None

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Client | None = None,
        gateway_key: str | None = None,
        identity: str | Path | None = None,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        default_root: str | None = None,
        shell: str = "sh",
        context: Context | None = None,
        connect_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if (url is None) == (client is None):
            raise ValueError("give either url= (to connect) or client= (a connected client)")
        super().__init__(**kwargs)
        self._url = url
        self._given = client
        self._client: Client | None = client
        self._connect = dict(
            gateway_key=gateway_key, identity=identity, token=token, tls_ca=tls_ca, context=context,
            **(connect_options or {}),
        )
        self._default_root = default_root
        self._shell_program = shell
        self._resources.register_factory("portcullis", self._make_resources)

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("the environment is not entered")
        return self._client

    async def _make_resources(self, env: Environment) -> PortcullisResources:
        return PortcullisResources(self.client)

    async def _setup(self) -> None:
        if self._client is None:
            assert self._url is not None
            self._client = await connect(self._url, **self._connect)
        files = PortcullisFileOperator(self._client, default_root=self._default_root)
        self._file_operator = files
        self._shell = PortcullisShell(self._client, files, shell=self._shell_program)
        with contextlib.suppress(ImportError):
            self._capabilities = [run_context_capability()]

    async def _teardown(self) -> None:
        self._file_operator = None
        self._shell = None
        if self._client is not None and self._given is None:
            await self._client.close()
            self._client = None

    async def get_context_instructions(self) -> str:
        base = await super().get_context_instructions()
        client = self.client
        roots = "\n".join(
            f'  <root id="{r.root_id}" path="{r.virtual_path}" mode="{r.mode}"/>' for r in client.roots
        )
        gateway = f"<gateway principal=\"{client.principal}\">\n{roots}\n</gateway>"
        return f"{base}\n{gateway}" if base else gateway

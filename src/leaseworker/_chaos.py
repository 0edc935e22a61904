"""A loopback TCP proxy that can delay, black-hole or cut traffic to a real server.

Put it between a client and a real Redis (or any TCP server) to reproduce a
slow or unreachable server on one side while a direct connection still sees
the truth. Public as ``leaseworker.testing.ChaosProxy``; it lives in a bottom
module of its own because the dev services, the campaign and the testing kit
all use it, and the testing kit's pytest plugin sits above the dev services.
"""

from __future__ import annotations

from types import TracebackType

import anyio
from anyio.abc import ByteStream, SocketAttribute, SocketListener, SocketStream, TaskGroup
from anyio.streams.stapled import MultiListener


class ChaosProxy:
    """Forward ``127.0.0.1:port`` to an upstream port, with switchable faults.

    ``blackhole = True`` swallows every byte in both directions while keeping
    connections open (a partition); ``refuse = True`` closes new connections at
    once (a dead server); ``reply_delay`` holds each chunk from the
    server for that many seconds (a slow link); ``cut()`` closes every
    connection (a crash or reset). ``swallowed`` is set when the first byte is
    swallowed, so a test can wait for "the request was sent into the void".
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.blackhole = False
        self.refuse = False
        self.reply_delay = 0.0
        self.swallowed = anyio.Event()
        self._task_group: TaskGroup | None = None
        self._listener: MultiListener[SocketStream] | SocketListener
        self._connections: set[anyio.CancelScope] = set()

    async def __aenter__(self) -> ChaosProxy:
        self._listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = self._listener.extra(SocketAttribute.local_port)
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._listener.serve, self._connect)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        try:
            return await self._task_group.__aexit__(exc_type, exc, tb)
        finally:
            await self._listener.aclose()

    def cut(self) -> None:
        """Close every open connection, as a server crash would."""
        for scope in self._connections:
            scope.cancel()

    async def _connect(self, client: ByteStream) -> None:
        if self.refuse:
            await client.aclose()
            return
        with anyio.CancelScope() as scope:
            self._connections.add(scope)
            try:
                try:
                    upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
                except OSError:  # the real server is down: the client sees a closed link
                    await client.aclose()
                    return
                async with client, upstream, anyio.create_task_group() as tg:
                    tg.start_soon(self._pump, client, upstream, False)
                    tg.start_soon(self._pump, upstream, client, True)
            finally:
                self._connections.discard(scope)
        await client.aclose()

    async def _pump(self, source: ByteStream, sink: ByteStream, is_reply: bool) -> None:
        try:
            async for chunk in source:
                if self.blackhole:
                    self.swallowed.set()
                    continue
                if is_reply and self.reply_delay:
                    await anyio.sleep(self.reply_delay)
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        await sink.aclose()

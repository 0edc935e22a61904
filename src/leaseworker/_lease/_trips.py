"""Lease scripts' round trips to Redis: one connection kept checked out, and one-off pipelines.

:class:`OwnConnection` carries :class:`~._pipelining.ScriptPipeline`'s trips
(packed commands written at once, replies read in order, ``WAIT`` after
them when asked); :func:`run_script`, :func:`run_scripts` and
:func:`run_asking` go through redis-py's own client (following a Cluster
``ASK``). Errors come back as values where a trip carries several calls, so
each caller sees its own.

Scripts run by SHA. Until the server is known to hold them, a trip starts
with ``SCRIPT LOAD``: on an :class:`OwnConnection`, of all its pipeline's
scripts, until one trip loaded them and again after every connect; through
redis-py, of the script it runs, known per client until a trip's error.
Answered ``NOSCRIPT``, a trip's ``WAIT`` counts the replicas of no write
(with them cut off, it blocked for all of the replica timeout, and the call
sent again after the load waited once more). ``NOSCRIPT`` still comes after
a ``SCRIPT FLUSH`` on a live connection: the call goes again with the load
in front, its ``WAIT`` given what is left of the replica timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, ResponseError
from redis.typing import EncodableT


@dataclass(frozen=True, slots=True)
class Replied:
    """A script's reply, with how many replicas acknowledged the writes before it.

    ``acked`` is ``WAIT``'s answer from the same connection, sent right after
    the script (``None`` when no replica acknowledgement was asked for).
    """

    value: Any
    acked: int | None


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """Ask for ``replicas`` acknowledgements within ``timeout_ms`` after each pipeline."""

    replicas: int
    timeout_ms: int

    def left(self, since: float) -> ReplicaWait:
        """Return what is left of the timeout ``since`` (``time.monotonic()``), 1 ms at least.

        ``WAIT`` with 0 blocks until the replicas answer, however long.
        """
        spent = math.ceil((time.monotonic() - since) * 1000)
        return ReplicaWait(self.replicas, max(1, self.timeout_ms - spent))


Command = tuple[EncodableT, ...]
"""One Redis command as its words: ``("EVALSHA", sha, numkeys, *keys, *args)``."""


Call = tuple[Sequence[str], Sequence[str]]
"""One script call's keys and args."""


@final
class OwnConnection:
    """One connection of the client's pool, kept checked out for a pipeline's trips.

    redis-py's per-command path checks a connection out of the pool and back in
    for every command or pipeline (a lock, an event dispatch, observability
    records, a ``can_read`` probe) and parses each reply through its callback
    table: about a fifth of a lone lease call's CPU. A :class:`ScriptPipeline`
    has one trip in flight at a time (its ``_busy`` flag), so one connection
    carries them all. Failures are handled as redis-py's path does: the
    connection's own ``Retry`` reconnects after a connection error (a
    Sentinel-managed connection then finds the new master), and a read cut
    off by the caller's deadline disconnects, so no late reply is read later.
    """

    __slots__ = ("_connection", "_loads", "_pool", "loaded")

    def __init__(self, redis: Redis, scripts: Iterable[str]) -> None:
        self._pool = redis.connection_pool
        self._connection: AbstractConnection | None = None
        self._loads: list[Command] = [("SCRIPT", "LOAD", source) for source in scripts]
        self.loaded = False
        """Whether the server holds the scripts: set by a trip that loaded them all.

        Cleared at every (re)connect (a restarted server, or another one after
        a failover), and by the caller on NOSCRIPT (a ``SCRIPT FLUSH``).
        """

    async def trip(self, commands: Sequence[Command], wait: ReplicaWait | None) -> list[Replied]:
        """Send ``commands`` (then ``WAIT`` when asked) in one write; errors come back as values."""
        connection = self._connection or await self._checkout()
        return await connection.retry.call_with_retry(
            lambda: self._trip(connection, commands, wait), lambda _: connection.disconnect()
        )

    async def run(self, command: Command, wait: ReplicaWait | None) -> Replied:
        """Run one ``EVALSHA`` alone (once more after NOSCRIPT); raise its error reply."""
        since = time.monotonic()
        [reply] = await self.trip((command,), wait)
        if isinstance(reply.value, NoScriptError):  # a flush: this time the loads go first
            self.loaded = False
            [reply] = await self.trip((command,), wait and wait.left(since))
        if isinstance(reply.value, Exception):
            raise reply.value
        return reply

    async def release(self) -> None:
        """Give the connection back to its pool (before the client closes)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await self._pool.release(connection)

    async def _checkout(self) -> AbstractConnection:
        connection: AbstractConnection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        self._connection = connection
        self.loaded = False  # another connection than the last, maybe to another server
        return connection

    async def _trip(
        self, connection: AbstractConnection, commands: Sequence[Command], wait: ReplicaWait | None
    ) -> list[Replied]:
        """One round trip: send every command in one write, read every reply.

        Until the server is known to hold the scripts, their loads go first.
        """
        if not connection.is_connected:
            # connect(), as the pool's checkout does: a Sentinel-managed connection asks
            # the sentinels for the master there (sending reconnects to the last address).
            self.loaded = False
            await connection.connect()  # type: ignore[no-untyped-call]
        loads = 0 if self.loaded else len(self._loads)
        if loads:
            commands = [*self._loads, *commands]
        if wait is not None:
            commands = [*commands, ("WAIT", wait.replicas, wait.timeout_ms)]
        await connection.send_packed_command(connection.pack_commands(commands))
        values: list[Any] = []
        for _ in commands:
            try:
                values.append(await connection.read_response())
            except ResponseError as error:  # an error reply: the next replies are still read
                values.append(error)
        if loads:
            self.loaded = not any(isinstance(value, Exception) for value in values[:loads])
            del values[:loads]
        if wait is None:
            return [Replied(value, None) for value in values]
        acked = values.pop()
        # As in _execute: WAIT refused (a demoted master) acknowledges nothing.
        acked = 0 if isinstance(acked, Exception) else int(acked)
        return [Replied(value, acked) for value in values]


async def run_script(
    redis: Redis,
    sha: str,
    source: str,
    keys: Sequence[str],
    args: Sequence[str],
    wait: ReplicaWait | None,
    loaded: set[str],
) -> Replied:
    """Run one script by SHA, loading it once on NOSCRIPT; ``WAIT`` after it when asked.

    Without ``wait`` this is redis-py's plain path (one command); with it, the
    script and its ``WAIT`` go as one pipeline, so both use the same connection
    (``WAIT`` counts the acknowledgements of that connection's writes), led by
    ``SCRIPT LOAD`` while ``sha`` is not in ``loaded`` (the client's known
    scripts, emptied by any error of its trips: see the module docstring).
    """
    if wait is None:
        try:
            return Replied(await redis.evalsha(sha, len(keys), *keys, *args), None)
        except NoScriptError:
            await redis.script_load(source)
            return Replied(await redis.evalsha(sha, len(keys), *keys, *args), None)
    since = time.monotonic()
    sources = {sha: source}
    [reply] = await _pipeline(redis, [(sha, keys, args)], wait, sources, loaded)
    if isinstance(reply.value, NoScriptError):
        loaded.discard(sha)
        [reply] = await _pipeline(redis, [(sha, keys, args)], wait.left(since), sources, loaded)
    if isinstance(reply.value, Exception):
        raise reply.value
    return reply


async def run_scripts(
    redis: Redis,
    sha: str,
    source: str,
    calls: Sequence[Call],
    wait: ReplicaWait | None,
    loaded: set[str],
) -> list[Replied]:
    """Run one script by SHA once per ``(keys, args)``, as one pipeline; errors come back as values.

    The pipeline starts with ``SCRIPT LOAD`` while ``sha`` is not in
    ``loaded`` (see :func:`run_script`); calls answered NOSCRIPT anyway go
    once more, with what is left of the replica timeout.
    """
    since = time.monotonic()
    sources = {sha: source}
    replies = await _pipeline(
        redis, [(sha, keys, args) for keys, args in calls], wait, sources, loaded
    )
    missing = [i for i, reply in enumerate(replies) if isinstance(reply.value, NoScriptError)]
    if missing:
        loaded.discard(sha)
        left = wait and wait.left(since)
        again = await _pipeline(redis, [(sha, *calls[i]) for i in missing], left, sources, loaded)
        for i, reply in zip(missing, again, strict=True):
            replies[i] = reply
    return replies


async def run_asking(
    redis: Redis,
    source: str,
    keys: Sequence[str],
    args: Sequence[str],
    wait: ReplicaWait | None,
) -> Replied:
    """Run one script on the node its slot is migrating to (after an ``ASK``).

    ``ASKING`` holds for the next command on its connection only, so it, the
    script (by source: the node may not have it cached) and the ``WAIT`` go
    as one pipeline.
    """
    pipe = redis.pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.eval(source, len(keys), *keys, *args)
    [_, value], acked = await _execute(pipe, wait)
    if isinstance(value, Exception):
        raise value
    return Replied(value, acked)


async def _pipeline(
    redis: Redis,
    calls: Sequence[tuple[str, Sequence[str], Sequence[str]]],
    wait: ReplicaWait | None,
    sources: Mapping[str, str],
    loaded: set[str],
) -> list[Replied]:
    """Send ``calls`` as one pipeline, then ``WAIT`` when asked; errors come back as values.

    Scripts of ``sources`` not in ``loaded`` are loaded first, and added once
    loaded; any error but a reply's (a connection lost, a timeout) empties
    ``loaded``: the next trip may reach a restarted or promoted server.
    """
    pipe = redis.pipeline(transaction=False)
    loads = [sha for sha in sources if sha not in loaded]
    for sha in loads:
        pipe.script_load(sources[sha])
    for sha, keys, args in calls:
        pipe.evalsha(sha, len(keys), *keys, *args)
    try:
        replies, acked = await _execute(pipe, wait)
    except BaseException:
        loaded.clear()
        raise
    for sha, reply in zip(loads, replies, strict=False):
        if not isinstance(reply, Exception):
            loaded.add(sha)
    return [Replied(reply, acked) for reply in replies[len(loads) :]]


async def _execute(pipe: Pipeline, wait: ReplicaWait | None) -> tuple[list[Any], int | None]:
    """Send ``pipe``, then ``WAIT`` when asked; return its replies and the replica count.

    Errors come back as values; the count is ``None`` without ``wait``.
    """
    if wait is not None:
        pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
    replies = list(await pipe.execute(raise_on_error=False))
    if wait is None:
        return replies, None
    acked = replies.pop()
    # WAIT can fail where the script did too (a demoted master answers MOVED to
    # the script and refuses WAIT): the script's own answer is what the caller
    # sees, and an unacknowledged write counts as acknowledged by no replica.
    return replies, 0 if isinstance(acked, Exception) else int(acked)

"""A pod on a SQLite file: an execution ends at its commit, its offset waits for the fsync.

In-process pods against the session's real Kafka and Redis, on a real WAL
file whose helper fsync the test holds: the completion is answered and the
slot freed before it is on disk, but the offset is committed only after an
fsync that began after the completion committed.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from leaseworker import open_store
from leaseworker._store import SqliteStore, WalSync
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, committed, payload, produce
from ..waiting import eventually
from ..worker_util import make_worker, pod_config, running


class HeldSync:
    """The store's fsync helper, held at its next fsync until ``release()``."""

    def __init__(self, sync: WalSync, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = anyio.Event()
        self._released = anyio.Event()
        self._real = sync._sync
        monkeypatch.setattr(sync, "_sync", self._held)

    async def _held(self) -> None:
        self.entered.set()
        await self._released.wait()
        await self._real()

    def release(self) -> None:
        """Let the held fsync (and every later one) run."""
        self._released.set()


@contextlib.asynccontextmanager
async def sqlite_file(path: Path) -> AsyncIterator[SqliteStore]:
    """A SQLite file store (WAL, helper fsync), closed after the block."""
    async with open_store(f"sqlite:///{path}", call_timeout=5.0) as store:
        assert isinstance(store, SqliteStore)
        assert store._db._sync is not None
        yield store


async def test_the_offset_waits_for_the_fsync_the_execution_did_not(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No offset is committed before the completions of the records it covers are on disk.

    The jobs complete (accepted: another connection reads the rows) while the
    fsync is held, so their slots free and the loop goes on (a renewal would
    too); the committer waits in the store's barrier, and Kafka has no
    committed offset until the fsync is let go.
    """
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    bootstrap = kafka_server.bootstrap_servers
    keys = [f"report-{i}" for i in range(3)]
    await produce(bootstrap, topic, [(key.encode(), payload(period="2026-12")) for key in keys])
    path = tmp_path / "c.sqlite3"
    async with sqlite_file(path) as store:
        assert store._db._sync is not None
        held = HeldSync(store._db._sync, monkeypatch)
        config = pod_config(kafka_server, redis_server, kafka_names, namespace)
        async with running(make_worker(job, config, store=store)):
            await recorder.until(lambda: all(recorder.done(key) == 1 for key in keys))
            with anyio.fail_after(10):
                await held.entered.wait()  # the committer's barrier asked for the fsync
            with contextlib.closing(sqlite3.connect(path)) as other:
                rows = other.execute("SELECT count(*) FROM leaseworker_completions").fetchone()
            assert rows == (3,)  # committed, answered, the slots free: not yet on disk
            assert await committed(bootstrap, kafka_names.group, topic) == {}
            held.release()

            async def settled() -> bool:
                return await committed(bootstrap, kafka_names.group, topic) == {0: 3}

            await eventually(settled, within=10)

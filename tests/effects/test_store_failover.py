"""The store on a PostgreSQL primary and streaming standby: the primary killed, the standby up.

Real servers (:class:`LocalPostgresPair`), the store opened once on the pair's
multi-host URL (``target_session_attrs=read-write``) and used on across the
promotion, with no restart. The primary's WAL sender is stopped (SIGSTOP)
before the kill where a test needs the standby to miss what came after:
that is what a lagging standby is, made certain.

- Synchronous standby: every completion and claim acknowledged before the
  kill is on the promoted node, the one whose commit was in flight was never
  acknowledged (``StoreUnavailable``), fences per key stay strictly
  increasing (a lower fence is refused after the promotion), and the same
  store object answers from the new primary.
- Asynchronous standby: the completions acknowledged while the standby
  lagged are lost with the primary (counted: 8 of 16), and a former holder's
  lower fence for such a key is accepted on the promoted node: the stale write
  the promotion let through. Its primary stays dead for 4 s while calls
  fail; the first call after the promotion is answered.
- A pod's transaction whose commit was in flight ends ``lost
  (store_unavailable)`` and its trigger completes once on the new primary.
- A real ``leaseworker run`` pod runs on through a promotion, no restart.
- A commit waiting for the synchronous standby past every bound (the
  statement's, the store's timeout, the server's check of its client) stays
  unseen by every session: a job's, and a completion's (autocommit); a
  takeover does not end a lower fence's session in that wait (on the code
  before it did: the row was seen, the taker answered ``duplicate``); nor
  a relay's mark, its timeout passed.

The synchronous pair is the module's: a test that promoted it leaves it
to the next, which gives it a fresh standby first (about 1 s); each test
has a database of its own.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import psycopg
import pytest

from leaseworker import (
    Backoff,
    CompletionRequest,
    CompletionStore,
    RedisLeases,
    StoreUnavailable,
    open_store,
)
from leaseworker._execution import Executor
from leaseworker._store import Message, effect_store, migrate_store
from leaseworker._store._postgres import refusal
from leaseworker.toolkit import Event, parse_store_url
from leaseworker_dev._services import LocalKafka, LocalPostgres, LocalPostgresPair, LocalRedis

from ..security.cli import leaseworker
from ..store.test_store import raw
from ..waiting import eventually
from .test_effects_pods import TABLE as POD_TABLE
from .test_effects_pods import Pods
from .test_transaction_faults import TABLE, Events, GatedJob, committed_once, run_gated


@pytest.fixture(scope="module")
def sync_pairs() -> Iterator[LocalPostgresPair]:
    """The module's primary and synchronous standby (each test that promotes it, rejoins it)."""
    yield from _pair(synchronous=True)


@pytest.fixture
def sync_pair(sync_pairs: LocalPostgresPair) -> LocalPostgresPair:
    """The module's synchronous pair, given a standby again if a test promoted it."""
    if sync_pairs.standby is None:
        sync_pairs.rejoin()
    return sync_pairs


@pytest.fixture
def async_pair() -> Iterator[LocalPostgresPair]:
    """A primary and its asynchronous standby (one test uses one)."""
    yield from _pair(synchronous=False)


def _pair(*, synchronous: bool) -> Iterator[LocalPostgresPair]:
    pair = LocalPostgresPair.start(synchronous=synchronous)
    try:
        yield pair
    finally:
        pair.stop()
    for node in pair.nodes:  # nothing left behind, a killed server's children included
        assert node.process.popen.returncode is not None
        assert not node.workdir.exists()
        assert not [cwd for cwd in _running_in() if cwd.startswith(str(node.workdir))]


async def fresh(pair: LocalPostgresPair) -> str:
    """The multi-host URL of a new database of ``pair``'s, this test's own, its schema made.

    Made here with 30 s to spare: each migration's commit waits for the synchronous
    standby, and a loaded machine took them past the short store timeouts the tests
    are about (a test's own open then only reads the schema's version).
    """
    url = pair.create_database(f"t{uuid.uuid4().hex[:12]}")
    await migrate_store(url, call_timeout=30.0)
    return url


def _running_in() -> list[str]:
    """The working directories of the processes running now (those we may read)."""
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        with contextlib.suppress(OSError):
            found.append(os.readlink(cwd))
    return found


def request(key: str, fence: int, version: str = "v1") -> CompletionRequest:
    """A completion of ``key``'s input ``version`` at ``fence``."""
    return CompletionRequest(
        job_key=key,
        input_version=version,
        fence=fence,
        result={"fence": fence},
        execution_id=f"{key}-{fence}",
        pod="pod-a",
    )


async def fail_over(pair: LocalPostgresPair) -> None:
    """Kill the primary's server and children, then promote the standby (in a thread: blocking)."""
    await anyio.to_thread.run_sync(pair.kill_primary)
    await anyio.to_thread.run_sync(pair.promote)


async def complete_all(store: CompletionStore, keys: list[str], fence: int) -> None:
    """Complete every key at ``fence``: each acknowledged ``accepted``."""
    for key in keys:
        assert (await store.complete(request(key, fence))).status == "accepted"


async def test_a_synchronous_standby_keeps_every_acknowledged_completion_and_the_fences(
    sync_pair: LocalPostgresPair, caplog: pytest.LogCaptureFixture
) -> None:
    """Acknowledged before the kill: on the promoted node; fences per key never go back."""
    assert sync_pair.standby is not None
    hosts = f"127.0.0.1:{sync_pair.primary.port},127.0.0.1:{sync_pair.standby.port}"
    assert f"@{hosts}/leaseworker?target_session_attrs=read-write" in sync_pair.url
    url = await fresh(sync_pair)
    alone = sync_pair.standby.url_for("leaseworker", target_session_attrs="read-write")
    with pytest.raises(psycopg.OperationalError):  # libpq refuses the standby a write session
        await (await psycopg.AsyncConnection.connect(alone)).close()
    keys = [f"report:{{k{i}}}" for i in range(16)]
    async with open_store(url, call_timeout=1.5) as store:
        assert not standby_warnings(caplog)  # commits wait for the standby
        await complete_all(store, keys[:8], fence=10)
        assert (await store.claim(keys[8], "v1", 20)).status == "claimed"
        os.kill(sync_pair.walsender_pid(), signal.SIGSTOP)  # the standby hears nothing more
        with pytest.raises(StoreUnavailable, match="no answer within"):
            await store.complete(request(keys[9], 30))  # committed locally, never acknowledged
        await fail_over(sync_pair)
        found = await store.lookup_many([(key, "v1") for key in keys[:8]])
        assert [c.fence if c else None for c in found] == [10] * 8
        assert (await store.complete(request(keys[0], 9, "v2"))).status == "stale"
        assert (await store.complete(request(keys[8], 19))).status == "stale"  # the claim held
        assert (await store.complete(request(keys[8], 21))).status == "accepted"
        assert (await store.complete(request(keys[9], 31))).status == "accepted"  # its retry
    heads = await raw(
        url,
        "SELECT job_key, greatest(fence, claimed_fence) FROM leaseworker_jobs",
    )
    assert dict(heads) == {**dict.fromkeys(keys[:8], 10), keys[8]: 21, keys[9]: 31}


async def test_an_asynchronous_standby_loses_what_it_had_not_received_and_lets_a_stale_write_in(
    async_pair: LocalPostgresPair, caplog: pytest.LogCaptureFixture
) -> None:
    """8 completions acknowledged while the standby lagged are lost; a lower fence then wins."""
    keys = [f"report:{{k{i}}}" for i in range(16)]
    checked = await anyio.to_thread.run_sync(
        functools.partial(leaseworker, "store", "check", "--store-url", async_pair.url)
    )
    line = f"leaseworker store check: warning: {warns(async_pair)}"
    assert (checked.code, checked.stderr.splitlines()) == (0, [line])
    assert json.loads(checked.stdout)["standbys"] == 1
    async with open_store(async_pair.url, call_timeout=1.5) as store:
        assert standby_warnings(caplog) == [warns(async_pair)]  # as at a pod's start
        await complete_all(store, keys[:8], fence=10)
        await anyio.to_thread.run_sync(_caught_up, async_pair)
        os.kill(async_pair.walsender_pid(), signal.SIGSTOP)
        await complete_all(store, keys[8:], fence=10)  # acknowledged at once: nobody waits
        await anyio.to_thread.run_sync(async_pair.kill_primary)
        await unavailable_for(store, OUTAGE)
        await anyio.to_thread.run_sync(async_pair.promote)
        found = await store.lookup_many([(key, "v1") for key in keys])
        lost = [key for key, completion in zip(keys, found, strict=True) if completion is None]
        assert lost == keys[8:]  # every completion acknowledged after the standby stopped
        later = [request(key, 9, "v2") for key in (keys[0], keys[8])]  # a former holder's
        answers = [(await store.complete(late)).status for late in later]
    assert answers == ["stale", "accepted"]  # refused where the fence survived, let in where lost


def test_a_start_while_no_node_takes_writes_waits_and_a_wrong_password_stays_refused(
    sync_pair: LocalPostgresPair,
) -> None:
    """The primary dead, the standby not yet promoted: a pod starting then waits (exit 2 before).

    libpq finds only a read-only server, twice; a third attempt taking any
    server connects, so the credentials work and the start waits. The same
    URL with a wrong password is still refused, and after the promotion the
    URL connects.
    """
    url = sync_pair.url  # its database on both nodes (a fresh one may not be replayed yet)
    wrong = url.replace(f":{sync_pair.primary.password}@", ":wrong@")
    sync_pair.kill_primary()
    with pytest.raises(psycopg.OperationalError) as failed:
        psycopg.connect(url, connect_timeout=2).close()
    assert (
        refusal(parse_store_url(url), failed.value, timeout=2) is None
    )  # refused on the code before
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(wrong, connect_timeout=2).close()
    reason = refusal(parse_store_url(wrong), refused.value, timeout=2)
    assert reason is not None
    assert "refused the connection" in str(reason)  # the words are the last host's
    sync_pair.promote()
    psycopg.connect(url, connect_timeout=2).close()


def warns(pair: LocalPostgresPair) -> str:
    """The one line ``store check`` and the store's opening say of ``pair``'s async standby."""
    shown = pair.url.replace(pair.primary.password, "***")
    return (
        f"completion store at {shown}: the primary does not wait for its 1 standby(s)"
        " (synchronous_standby_names is empty): a failover loses the commits they had not"
        " received, and fences with them"
    )


def standby_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The store's warnings that commits do not wait for a standby, so far."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "leaseworker.store" and r.levelno == logging.WARNING and "standby" in r.msg
    ]


def test_store_check_on_a_single_node_says_nothing(
    postgres_server: LocalPostgres, tmp_path: Path
) -> None:
    """No standby, no failover to lose a commit to: no warning, ``standbys`` 0; SQLite alike."""
    checked = leaseworker("store", "check", "--store-url", postgres_server.url)
    assert (checked.code, checked.stderr) == (0, "")
    assert json.loads(checked.stdout)["standbys"] == 0
    sqlite = tmp_path / "completions.sqlite3"
    checked = leaseworker("store", "check", "--store-url", f"sqlite:///{sqlite}")
    answer = (checked.code, checked.stderr, json.loads(checked.stdout))
    assert answer == (0, "", {"backend": "sqlite"})
    assert not sqlite.exists()  # changing nothing


OUTAGE = 4.0
"""Seconds between the kill and the promotion: psycopg's pool would retry only at 7 s."""


async def unavailable_for(store: CompletionStore, seconds: float) -> None:
    """Call the store for ``seconds``, as a pod would: every call ends ``StoreUnavailable``.

    The pool reconnects in the background meanwhile; with its default
    ``reconnect_timeout`` (5 min) its attempts back off 1, 2, 4 s..., so the
    store would follow the promotion only at the next (on the code before:
    the first call after it timed out).
    """
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with pytest.raises(StoreUnavailable):
            await store.lookup("report:{outage}", "v1")
        await anyio.sleep(0.1)


def _caught_up(pair: LocalPostgresPair) -> None:
    """Block until the standby replayed everything the primary wrote so far."""
    assert pair.standby is not None
    [(written,)] = pair.primary.query(b"SELECT pg_current_wal_insert_lsn()::text")
    deadline = time.monotonic() + 30
    while not pair.standby.query(
        f"SELECT pg_last_wal_replay_lsn() >= '{written}'::pg_lsn".encode()
    )[0][0]:
        assert time.monotonic() < deadline, "the standby did not catch up"
        time.sleep(0.02)


async def test_a_commit_in_flight_when_the_primary_dies_is_lost_and_retried_on_the_new_one(
    sync_pair: LocalPostgresPair, leases: RedisLeases, namespace: str
) -> None:
    """The job's commit waits for the standby past the store's timeout; the primary dies.

    The execution ends ``lost`` at the timeout, and its commit stays unseen by
    other sessions: nothing cancelled the server's wait (at the store's
    timeout the socket is shut down, no cancel request sent). A cancelled
    wait for a synchronous standby commits at once, locally: a relay could
    send its messages, and the promotion would lose the row. Its trigger
    then completes once on the new primary.
    """
    url = await fresh(sync_pair)
    await raw(url, TABLE)
    job, events = GatedJob(url, then=None), FirstEnd()  # after the gate, the commit
    async with open_store(url, call_timeout=1.0) as store:

        async def kill_after_the_commit_timed_out() -> None:
            os.kill(sync_pair.walsender_pid(), signal.SIGSTOP)
            job.go.set()
            await anyio.to_thread.run_sync(_committing, sync_pair)
            await events.first.wait()
            assert events.finished[0] == ("lost", "store_unavailable")
            assert await anyio.to_thread.run_sync(_visible_rows, sync_pair, url) == 0
            await fail_over(sync_pair)

        slow = Backoff(initial=0.5, cap=1.0)  # the losses before the promotion stay few
        pod = Executor(
            job, leases, pod="pod-a", store=store, store_namespace=namespace, hooks=[events],
            lost_retry=slow,
        )  # fmt: skip
        ending = await run_gated(pod, job, kill_after_the_commit_timed_out)
    assert ending.outcome == "completed"
    assert events.finished[-1] == ("completed", None)
    await committed_once(url, namespace)


class FirstEnd(Events):
    """Events whose ``first`` is set when the first execution finished."""

    def __init__(self) -> None:
        super().__init__()
        self.first = anyio.Event()

    def __call__(self, event: Event) -> None:
        """Keep the event; set ``first`` once an execution finished."""
        super().__call__(event)
        if self.finished:
            self.first.set()


def _visible_rows(pair: LocalPostgresPair, url: str) -> int:
    """Count the job's rows other sessions of the primary see now (in ``url``'s database)."""
    database = url.rpartition("/")[2].partition("?")[0]
    [(count,)] = pair.primary.query(b"SELECT count(*) FROM report", database=database)
    return int(count)


def _committing(pair: LocalPostgresPair) -> None:
    """Block until a session of the primary waits for the standby to confirm its commit."""
    deadline = time.monotonic() + 30
    while not pair.primary.query(b"SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'"):
        assert time.monotonic() < deadline, "no commit waited for the standby"
        time.sleep(0.02)


@pytest.mark.timeout(120)
async def test_a_pod_runs_on_through_a_promotion_without_a_restart(
    sync_pair: LocalPostgresPair, kafka_server: LocalKafka, redis_server: LocalRedis, tmp_path: Path
) -> None:
    """A real pod on the pair's URL: a trigger sent while the primary is dead completes once.

    Its executions end ``lost (store_unavailable)`` until the standby is
    promoted, then it completes on the new primary: same pod process, every
    row and message once, the relay sending from the new primary too.
    """
    url = await fresh(sync_pair)
    await raw(url, POD_TABLE)
    pods = Pods(kafka_server, redis_server.url, url, tmp_path)
    try:
        pod = await pods.spawn("pod-a", "a")
        await pods.send("a", inputVersion="before")
        await pods.until("committed", "pod-a")
        await anyio.to_thread.run_sync(sync_pair.kill_primary)
        await pods.send("a", inputVersion="after")

        async def lost_once() -> bool:
            return "store_unavailable" in pod.log_text()

        await eventually(lost_once, within=30)
        await anyio.to_thread.run_sync(sync_pair.promote)

        async def both_committed() -> bool:
            return len(pods.marks("committed", "pod-a")) == 2

        await eventually(both_committed, within=45)
        rows = await raw(url, "SELECT version, fence FROM report_rows ORDER BY fence")
        assert [version for version, _ in rows] == ["before", "after"]

        async def all_sent() -> bool:
            unsent = await raw(url, "SELECT count(*) FROM leaseworker_outbox_unsent")
            return unsent == [(0,)]

        await eventually(all_sent, within=30)
        assert await raw(url, "SELECT count(*) FROM leaseworker_outbox") == [(2,)]
        assert pod.running()
    finally:
        await pods.close()


SLACK = 0.5
"""Seconds past a bound before a commit still waiting is taken as outliving it."""


@pytest.fixture
def threaded_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make psycopg cancel as on a libpq before 17: the cancel request goes from a thread.

    The thread runs on when the await is cancelled again, so the request
    always leaves (with libpq 17's it is mostly cut short: a race).
    """
    monkeypatch.setattr(psycopg.capabilities, "has_cancel_safe", lambda check=False: False)


async def test_a_job_commit_waiting_for_the_standby_outlives_its_bounds_unseen(
    sync_pair: LocalPostgresPair, threaded_cancel: None
) -> None:
    """The commit's statements get 0.2 s (the lease's), the call 1 s, the server's client check 1 s.

    Past all of them the session still waits for the standby and no session
    sees the row: nothing cancelled or ended the wait (that would commit it).
    """
    url, key = await fresh(sync_pair), "report:{a}"
    walsender = sync_pair.walsender_pid()
    async with open_store(url, call_timeout=1.0) as store:
        transaction = effect_store(store).transaction(key, "v1", 10, budget=lambda: 0.2)
        async with transaction as tx:
            pid = tx.connection.info.backend_pid
            os.kill(walsender, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(StoreUnavailable, match=r"no answer within 1\.0s"):
                    await tx.commit(request(key, 10), [])
                until = started + 1.0 + CHECK_SECONDS + SLACK
                await anyio.to_thread.run_sync(_waits_for_the_standby, sync_pair, pid, until)
                assert await anyio.to_thread.run_sync(_completions, sync_pair, url) == 0
            finally:
                os.kill(walsender, signal.SIGCONT)


async def test_a_completion_waiting_for_the_standby_outlives_its_bounds_unseen(
    sync_pair: LocalPostgresPair, threaded_cancel: None
) -> None:
    """The same for ``store.complete`` (autocommit, the session's statement_timeout: 1 s)."""
    url = await fresh(sync_pair)
    walsender = sync_pair.walsender_pid()
    async with open_store(url, call_timeout=1.0) as store:
        os.kill(walsender, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"no answer within 1\.0s"):
                await store.complete(request("report:{b}", 10))
            [pid] = await anyio.to_thread.run_sync(_committing_in, sync_pair, url)
            until = started + 1.0 + CHECK_SECONDS + SLACK
            await anyio.to_thread.run_sync(_waits_for_the_standby, sync_pair, pid, until)
            assert await anyio.to_thread.run_sync(_completions, sync_pair, url) == 0
        finally:
            os.kill(walsender, signal.SIGCONT)


async def test_a_takeover_does_not_end_a_session_waiting_for_the_standby_to_commit(
    sync_pair: LocalPostgresPair, caplog: pytest.LogCaptureFixture
) -> None:
    """Fence 10's commit waits for the standby; fence 20's completion waits for the head row.

    Its looks (every 0.2 s) leave the committing session alone: fence 20's
    call times out, the row unseen. The standby back, fence 10's commit is
    answered ``accepted`` and fence 20's call ``duplicate``. On the code
    before, the look ended the session: committed locally, seen, and fence
    20 was answered ``duplicate`` while the standby still lacked the row.
    """
    caplog.set_level(logging.INFO, logger="leaseworker.store")
    url, key = await fresh(sync_pair), "report:{c}"
    walsender = sync_pair.walsender_pid()
    committed = []
    async with (
        open_store(url, call_timeout=30.0) as older,
        open_store(url, call_timeout=1.5) as newer,
        effect_store(older).transaction(key, "v1", 10) as tx,
    ):
        pid = tx.connection.info.backend_pid

        async def commit() -> None:
            committed.append(await tx.commit(request(key, 10), []))

        os.kill(walsender, signal.SIGSTOP)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(commit)
                await anyio.to_thread.run_sync(_committing, sync_pair)
                with pytest.raises(StoreUnavailable, match=r"no answer within 1\.5s"):
                    await newer.complete(request(key, 20))
                until = time.monotonic()
                await anyio.to_thread.run_sync(_waits_for_the_standby, sync_pair, pid, until)
                assert await anyio.to_thread.run_sync(_completions, sync_pair, url) == 0
                os.kill(walsender, signal.SIGCONT)
        finally:
            os.kill(walsender, signal.SIGCONT)
    assert [answer.status for answer in committed] == ["accepted"]
    assert (await newer_answer(url, key)) == "duplicate"
    assert caplog.text.count("(fence 10) holds a job key's head row and is committing") == 1
    assert "ended the session" not in caplog.text


async def test_a_relay_mark_waiting_for_the_standby_outlives_the_store_timeout_unseen(
    sync_pair: LocalPostgresPair, threaded_cancel: None
) -> None:
    """The mark commits the claim: past the store's timeout and the client check, still unsent."""
    url, key = await fresh(sync_pair), "report:{d}"
    walsender = sync_pair.walsender_pid()
    async with open_store(url, call_timeout=1.0) as store:
        effects = effect_store(store)
        async with effects.transaction(key, "v1", 10) as tx:
            await tx.commit(request(key, 10), [Message.build("reports.ready", {"n": 1})])
        [row] = await effects.claim_outbox("relay-a", limit=10, hold=30.0)
        os.kill(walsender, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"no answer within 1\.0s"):
                await effects.mark_sent("relay-a", [row.id])
            [pid] = await anyio.to_thread.run_sync(_committing_in, sync_pair, url)
            until = started + 1.0 + CHECK_SECONDS + SLACK
            await anyio.to_thread.run_sync(_waits_for_the_standby, sync_pair, pid, until)
            database = url.rpartition("/")[2].partition("?")[0]
            unsent = sync_pair.primary.query(
                b"SELECT count(*) FROM leaseworker_outbox_unsent", database=database
            )
            assert unsent == [(1,)]
        finally:
            os.kill(walsender, signal.SIGCONT)


async def newer_answer(url: str, key: str) -> str:
    """Fence 20's completion of ``key`` again, from a store of its own: its status."""
    async with open_store(url, call_timeout=5.0) as store:
        return (await store.complete(request(key, 20))).status


CHECK_SECONDS = 1.0
"""The store's ``client_connection_check_interval`` (the server's look at a client gone)."""


def _waits_for_the_standby(pair: LocalPostgresPair, pid: int, until: float) -> None:
    """Block until a look after ``until`` (monotonic); at each, ``pid`` waits in ``SyncRep``."""
    while True:
        now = time.monotonic()
        rows = pair.primary.query(
            f"SELECT wait_event FROM pg_stat_activity WHERE pid = {pid}".encode()
        )
        assert rows == [("SyncRep",)], f"backend {pid} stopped waiting for the standby: {rows}"
        if now > until:
            return
        time.sleep(0.05)


def _committing_in(pair: LocalPostgresPair, url: str) -> list[int]:
    """The backends of ``url``'s database that wait for the standby to confirm their commit."""
    database = url.rpartition("/")[2].partition("?")[0]
    rows = pair.primary.query(
        b"SELECT pid FROM pg_stat_activity"
        b" WHERE wait_event = 'SyncRep' AND datname = current_database()",
        database=database,
    )
    return [int(pid) for (pid,) in rows]


def _completions(pair: LocalPostgresPair, url: str) -> int:
    """Count the completions other sessions of the primary see now (in ``url``'s database)."""
    database = url.rpartition("/")[2].partition("?")[0]
    [(count,)] = pair.primary.query(
        b"SELECT count(*) FROM leaseworker_completions", database=database
    )
    return int(count)

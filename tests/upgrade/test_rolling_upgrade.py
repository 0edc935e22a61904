"""A rolling upgrade as a routine fault: pods of the previous release replaced one at a time.

Two ``leaseworker run`` pods of the previous release (built into the cache by
:mod:`.previous`, from the commit ``releases.toml`` records) share a group,
Redis namespace and PostgreSQL store. While triggers flow, a pod of this code
joins (it migrates the store's schema), then one old pod drains and exits,
then a second new pod joins and the last old pod drains and exits. Every
trigger is committed, every identity accepted once and only once, each exact
repeat sent answered ``duplicate`` (some by a pod of the other release), the
fences of each key strictly increase, no two executions of a key overlap,
and the old pods keep completing on the migrated schema.
"""

from __future__ import annotations

import collections
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from leaseworker import __version__
from leaseworker._store import MIGRATIONS
from leaseworker.toolkit import Execution
from leaseworker_dev._services import LocalKafka, LocalPostgres, LocalRedis, PodProcess
from leaseworker_dev._services import pod_process as describe_pod

from ..kafka_util import KafkaNames, committed
from ..pods import REPO, overlapping, ready, recorded
from ..waiting import eventually
from .previous import BuiltRelease, build, previous_release

PARTITIONS = 4
KEYS = 12  # report:0..11 hash onto all four partitions: every pod gets triggers
BATCH = 8  # new identities a batch sends, every FLOW_EVERY seconds, plus one exact repeat
FLOW_EVERY = 0.3
_DUPLICATE = re.compile(r"\bevent=finished\b.*\boutcome=duplicate\b")
NEW_SCHEMA = MIGRATIONS[-1].version  # what this tree's first pod migrates the store to


@pytest.fixture(scope="module")
def previous() -> BuiltRelease:
    """The previous release, built into the cache once (about a minute when cold)."""
    version, commit = previous_release()
    try:
        return build(version, commit)
    except (LookupError, RuntimeError) as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def pods() -> Iterator[dict[str, PodProcess]]:
    """The pods started so far, by name; any still running at the end is SIGKILLed."""
    started: dict[str, PodProcess] = {}
    yield started
    for pod in started.values():
        pod.kill()


def _start(
    pods: dict[str, PodProcess],
    name: str,
    env: dict[str, str],
    workdir: Path,
    release: BuiltRelease | None,
) -> PodProcess:
    """Start pod ``name`` of ``release`` (``None``: this code) on ``tests.jobs:MarkerJob``."""
    pod = describe_pod(
        name,
        "tests.jobs:MarkerJob",
        workdir=workdir,
        env=env,
        cwd=release.tree if release else REPO,
        python=str(release.python) if release else sys.executable,
    )
    pods[name] = pod.start()
    return pod


async def test_two_pods_of_the_previous_release_are_replaced_one_at_a_time_with_nothing_lost(
    previous: BuiltRelease,
    pods: dict[str, PodProcess],
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    postgres_server: LocalPostgres,
    kafka_names: KafkaNames,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The rolling replacement, with triggers flowing throughout (invariants: the module's)."""
    store_url = postgres_server.create_database(f"t{namespace}")
    bootstrap = kafka_server.bootstrap_servers
    kafka_server.create_topics([kafka_names.topic], partitions=PARTITIONS)
    env = {
        "LEASEWORKER_BOOTSTRAP_SERVERS": bootstrap,
        "LEASEWORKER_REDIS_URL": redis_server.url,
        "LEASEWORKER_STORE_URL": store_url,
        "LEASEWORKER_GROUP": kafka_names.group,
        "LEASEWORKER_NAMESPACE": namespace,
        "LEASEWORKER_SESSION_TIMEOUT": "6",
        "LEASEWORKER_PROCESS_WORKERS": "0",
        "LW_TEST_TOPIC": kafka_names.topic,
        "LW_TEST_LEASE": "3",
    }
    began = time.monotonic()
    old_a = _start(pods, "old-a", env, tmp_path, previous)
    old_b = _start(pods, "old-b", env, tmp_path, previous)
    await _until("the old pods ready", lambda: _all_ready(old_a, old_b), within=60, pods=pods)
    sent: list[tuple[str, str]] = []  # (job key, input version) of each record, in order
    stop = anyio.Event()

    async def flow() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        with anyio.fail_after(30):
            await producer.start()
        try:
            while not stop.is_set():
                batch = [
                    (f"report:{(len(sent) + i) % KEYS}", f"v{len(sent) + i}") for i in range(BATCH)
                ]
                if len(sent) >= 2 * BATCH:
                    batch.append(sent[-2 * BATCH])  # an exact repeat: a redelivery
                for key, version in batch:
                    body = {"inputVersion": version, "seconds": 0.05}
                    await producer.send_and_wait(
                        kafka_names.topic, json.dumps(body).encode(), key=key.encode()
                    )
                sent.extend(batch)
                with anyio.move_on_after(FLOW_EVERY):
                    await stop.wait()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await producer.stop()

    async with anyio.create_task_group() as tg:
        tg.start_soon(flow)
        await _until(
            "10 completions on the old pods",
            lambda: _accepted_by(pods, "old-", at_least=10),
            within=30,
            pods=pods,
        )
        new_a = _start(pods, "new-a", env, tmp_path, None)
        await _until("new-a ready", lambda: ready(new_a), within=60, pods=pods)
        migrated_at = time.monotonic()
        assert await _schema(store_url) == (NEW_SCHEMA, __version__)
        await _until(
            "old-b completing on the migrated schema",
            lambda: _accepted_by(pods, "old-b", at_least=1, after=migrated_at),
            within=30,
            pods=pods,
        )
        assert await old_a.stop(within=30) == 0
        new_b = _start(pods, "new-b", env, tmp_path, None)
        await _until("new-b ready", lambda: ready(new_b), within=60, pods=pods)
        assert await old_b.stop(within=30) == 0
        await _until(
            "a completion on new-b",
            lambda: _accepted_by(pods, "new-b", at_least=1),
            within=30,
            pods=pods,
        )
        stop.set()

    async def all_committed() -> bool:
        found = await committed(bootstrap, kafka_names.group, kafka_names.topic)
        return sum(found.values()) == len(sent)

    await _until("every trigger committed", all_committed, within=60, pods=pods)
    for pod in (new_a, new_b):
        assert await pod.stop(within=30) == 0
    elapsed = time.monotonic() - began
    executions = recorded(list(pods.values()))
    duplicates = [pod.name for pod in pods.values() for _ in _DUPLICATE.finditer(pod.log_text())]
    _check(executions, sent, duplicates)
    assert overlapping(executions) == []
    for pod in pods.values():
        assert "Traceback" not in pod.log_text(), pod.name
    print(f"{previous.version} -> {__version__}: {len(sent)} triggers in {elapsed:.1f} s")


def _check(executions: list[Execution], sent: list[tuple[str, str]], duplicates: list[str]) -> None:
    """Each identity accepted once; each repeat answered duplicate; fences rise per key.

    ``duplicates``: the pods that answered a trigger ``duplicate`` (a repeat
    answered from the store before any lease is not an execution: it is in
    the pods' logs only).
    """
    accepted = collections.Counter(
        (e.job_key, e.input_version) for e in executions if e.completion == "accepted"
    )
    assert accepted == collections.Counter(set(sent))
    repeats = len(sent) - len(set(sent))
    assert len(duplicates) >= repeats > 0
    releases = {pod.partition("-")[0] for pod in duplicates}
    assert releases == {"old", "new"}, f"only {releases} answered duplicate"
    # A lost lease is retried and fenced (the identities above say it came to
    # nothing); a failure or a timeout would be a pod of one release unable
    # to run what the other sent.
    assert [e for e in executions if e.outcome in ("failed", "timed_out")] == []
    fences: dict[str, list[int]] = collections.defaultdict(list)
    for execution in executions:  # in start order
        if execution.fence is not None:
            fences[execution.job_key].append(execution.fence)
    for key, seen in fences.items():
        assert seen == sorted(set(seen)), f"{key}: fences {seen} do not strictly increase"


async def _until(
    what: str, check: Callable[[], Awaitable[bool]], *, within: float, pods: dict[str, PodProcess]
) -> None:
    """``eventually``, failing with the step's name and each pod's last line."""
    try:
        await eventually(check, within=within)
    except TimeoutError:
        said = "; ".join(f"{name}: {pod.last_words()}" for name, pod in pods.items())
        raise AssertionError(f"{what}: not within {within:.0f} s ({said})") from None


async def _all_ready(*pods: PodProcess) -> bool:
    """Whether every pod says ready, holding a partition."""
    return all([await ready(pod) for pod in pods])


async def _accepted_by(
    pods: dict[str, PodProcess], prefix: str, *, at_least: int, after: float = 0.0
) -> bool:
    """Whether pods named ``prefix...`` had ``at_least`` completions accepted, begun ``after``."""
    mine = [pod for name, pod in pods.items() if name.startswith(prefix)]
    done = [e for e in recorded(mine) if e.completion == "accepted" and e.start >= after]
    return len(done) >= at_least


async def _schema(url: str) -> tuple[int, str | None]:
    """The store's schema version and the release that applied it."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (
            await conn.execute(
                "SELECT version, release FROM leaseworker_schema_version"
                " ORDER BY version DESC LIMIT 1"
            )
        ).fetchone()
    assert row is not None
    return int(row[0]), row[1]

"""Shared fixtures: Redis, Kafka and PostgreSQL servers per session, fresh names per test."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from leaseworker import CompletionStore, RedisLeases, open_store
from leaseworker_dev._services import (
    LocalKafka,
    LocalPostgres,
    LocalRedis,
    LocalRedisCluster,
    LocalSentinelGroup,
    LocalStack,
    PodProcess,
)

from .health_util import spawn
from .kafka_util import KafkaNames
from .process_work import alive
from .processes import child_commands

# The plugin users get from the `pytest11` entry point (disabled in pyproject.toml's addopts:
# loaded from there it would import leaseworker before coverage starts measuring it), and the
# suite's own report (wall time per directory, after --durations' slowest tests).
pytest_plugins = ["leaseworker_dev.pytest_plugin", "leaseworker_dev._suite_report", "pytester"]


ONE_WORKER_STACKS = {
    "sentinel_group": "sentinel",
    "redis_cluster": "cluster",
    "own_kafka": "own-kafka",
    "engine": "podman",
    **dict.fromkeys(
        ("secured_kafka", "secure_postgres", "redis_tls", "sentinel_tls", "cluster_tls"),
        "secured",
    ),
    "secured": "secured",  # tests/security's topologies, asked for by getfixturevalue
    "otlp_collector": "secured",
}
"""Session stacks whose tests run in one xdist worker (``--dist loadgroup``), in turn.

Each worker has services of its own (its ``local_stack``), so no test shares a
service with a test running at the same moment. These stacks are costly to start
(six Redis processes and three sentinels, a JVM, Podman's image build; the secured
peers: a SASL_SSL broker, TLS Redis in each topology, PostgreSQL on TLS) and their
tests restart, fail over, pause or stop parts of them: in one group each starts
once per run instead of once per worker (and two image builds never race). A test
that asks for one by ``request.getfixturevalue`` names its group itself
(``pytest.param(..., marks=pytest.mark.xdist_group(...))``).
"""

GROUPS_FIRST = ("campaigns", "secured", "sentinel", "cluster", "podman", "own-kafka")
"""The groups, longest first (the five campaigns take about 330 s of one worker's time):
the workers take them before any other test, so the longest starts at once and none is
left to run alone at the end. xdist's own order (most tests first) would start the
campaigns after the secured peers' eighty tests."""


def pytest_configure(config: pytest.Config) -> None:
    """Know the ``xdist_group`` mark without pytest-xdist too; stop cleanly on SIGTERM."""
    config.addinivalue_line("markers", "xdist_group(name): run in one xdist worker, in turn")
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(_GroupsFirst(), "leaseworker-groups-first")
    signal.signal(signal.SIGTERM, functools.partial(_interrupted, config))


def _interrupted(config: pytest.Config, signum: int, frame: object) -> None:
    """SIGTERM (``timeout``, a CI's cancel) as Ctrl-C: the session's teardowns stop its services.

    Python's default would end the process at once, leaving the session's Redis, Kafka
    and PostgreSQL running. xdist's controller passes it on to its workers, whose
    sessions hold the services, and waits until those are stopped (the workers' children
    gone; the workers themselves wait for the controller): interrupted at once, it would
    end them without their teardowns. Further SIGTERMs are ignored (``timeout`` signals
    the whole process group, and the controller signals its workers again): SIGKILL is
    there for a teardown that hangs.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if config.pluginmanager.has_plugin("dsession"):  # the controller: its children are workers
        workers = set(child_commands(os.getpid()))
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

        def tearing_down(worker: int) -> bool:
            return alive(worker) and any(map(alive, child_commands(worker)))

        deadline = time.monotonic() + 60
        while any(map(tearing_down, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}: stopping the session's services")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each test that uses one of :data:`ONE_WORKER_STACKS` in that stack's group.

    In an xdist worker, the groups go to the controller's scheduler (``tests/xdist_groups.py``).
    """
    groups: dict[str, str] = {}
    for item in items:
        used = item.fixturenames if isinstance(item, pytest.Function) else ()
        stacks = sorted(group for fixture, group in ONE_WORKER_STACKS.items() if fixture in used)
        if stacks:
            item.add_marker(pytest.mark.xdist_group(stacks[0]))
        named = sorted(str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args)
        if named:
            groups[item.nodeid] = named[0]
    if hasattr(config, "workerinput"):
        from .xdist_groups import write

        write(config, groups)
        config.stash[_ITEM_GROUPS] = groups


_ITEM_GROUPS = pytest.StashKey[dict[str, str]]()


class _GroupsFirst:
    """In an xdist worker, the tests of :data:`GROUPS_FIRST` first, in its order.

    A plugin of its own for a hook that runs last: after pytest's reordering by
    fixture scope.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Sort the groups' tests to the front (stable: each keeps its order)."""
        groups, rank = config.stash[_ITEM_GROUPS], {g: n for n, g in enumerate(GROUPS_FIRST)}
        items.sort(key=lambda item: rank.get(groups.get(item.nodeid, ""), len(rank)))


_GROUPS = pytest.StashKey[Path]()


def _groups_directory(config: pytest.Config) -> Path:
    """The controller's directory where the workers write their groups (made once)."""
    if _GROUPS not in config.stash:
        config.stash[_GROUPS] = Path(tempfile.mkdtemp(prefix="lwgroups-"))
    return config.stash[_GROUPS]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each xdist worker where to write its groups."""
    from .xdist_groups import KEY

    node.workerinput[KEY] = str(_groups_directory(node.config))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``, xdist's scheduling with the groups the workers wrote."""
    if config.getoption("dist") != "loadgroup":
        return None
    from .xdist_groups import StackGroups

    config.option.loadscopereorder = False  # the workers' order: GROUPS_FIRST
    return StackGroups(config, log, _groups_directory(config))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the groups' directory (the controller's, when there was one)."""
    if _GROUPS in config.stash:
        shutil.rmtree(config.stash[_GROUPS], ignore_errors=True)


@pytest.fixture(scope="session")
def local_stack() -> Iterator[LocalStack]:
    """The session's services from the one stack builder: each starts on first use.

    All of them stop at the session's end, by PID. The plugin's fixtures use it
    too (``leaseworker_stack`` below): one Redis and one Kafka, not two.
    """
    with LocalStack() as stack:
        yield stack


@pytest.fixture(scope="session")
def redis_server(local_stack: LocalStack) -> LocalRedis:
    """A private redis-server on a free loopback port for the session."""
    return local_stack.redis


@pytest.fixture(scope="session")
def sentinel_group(local_stack: LocalStack) -> LocalSentinelGroup:
    """One Sentinel group (master, two replicas, three sentinels) for the session.

    It starts in about 3 s; tests restore it with ``await sentinel_group.settle()``
    before they fail it over, kill or pause a node.
    """
    return local_stack.sentinel


@pytest.fixture(scope="session")
def redis_cluster(local_stack: LocalStack) -> LocalRedisCluster:
    """One six-node Redis Cluster (three shards of master + replica) for the session.

    Tests restore it with ``await redis_cluster.settle()`` before they fail a
    shard over, kill, pause or cut off a node.
    """
    return local_stack.cluster


@pytest.fixture
async def redis(redis_server: LocalRedis) -> AsyncIterator[Redis]:
    """A direct client: the test's view of the truth in Redis."""
    client = Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def namespace() -> str:
    """A namespace of this test's own, so tests never see each other's keys."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def leases(redis: Redis, namespace: str) -> RedisLeases:
    """Leases over the direct client, each call given 2 s: a loaded machine never times one out.

    A held lease must then last over 3.2 s at the default renewal interval (a third of
    it), or renew more often: ``renewal_interval + command_timeout`` must end before
    the local deadline.
    """
    return RedisLeases(redis, namespace=namespace, command_timeout=2.0)


@pytest.fixture
def short_timeout_leases(redis: Redis, namespace: str) -> RedisLeases:
    """Leases whose calls time out after 0.2 s, for tests whose lease must be shorter.

    Only for a test whose subject is a lease of well under a second (a body stalling the
    loop past it, renewals outliving it): a 2 s call budget would not fit such a lease.
    Each user says why; a call slower than 0.2 s on a loaded machine fails it.
    """
    return RedisLeases(redis, namespace=namespace, command_timeout=0.2)


@pytest.fixture(scope="session")
def kafka_server(local_stack: LocalStack) -> LocalKafka:
    """One private Kafka broker (KRaft) per session; tests use their own topics and groups."""
    return local_stack.kafka


@pytest.fixture
def kafka_names() -> KafkaNames:
    """Topic and group names of this test's own."""
    return KafkaNames(uuid.uuid4().hex[:10])


@pytest.fixture
def topic(kafka_server: LocalKafka, kafka_names: KafkaNames) -> str:
    """A fresh one-partition trigger topic plus its dead-letter topic."""
    kafka_server.create_topics([kafka_names.topic, kafka_names.dead_letters])
    return kafka_names.topic


@pytest.fixture
def health_pods(tmp_path: Path) -> Iterator[Callable[..., PodProcess]]:
    """Start ``leaseworker run`` pods serving health endpoints; SIGKILL the rest at the end."""
    started: list[PodProcess] = []

    def start(name: str, job: str, env: dict[str, str], *extra: str) -> PodProcess:
        pod = spawn(name, job, tmp_path, env, *extra)
        started.append(pod)
        return pod

    yield start
    for pod in started:
        pod.kill()


@pytest.fixture(scope="session")
def postgres_server(local_stack: LocalStack) -> LocalPostgres:
    """One private PostgreSQL cluster per session; tests take a database each."""
    return local_stack.postgres


@pytest.fixture
def store_url_for(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """Make the URL of an empty completion store of the test's own on a named backend."""

    def make(backend: str) -> str:
        if backend == "memory":
            return "memory://"
        if backend == "sqlite":
            return f"sqlite:///{tmp_path / 'completions.sqlite3'}"
        server: LocalPostgres = request.getfixturevalue("postgres_server")
        return server.create_database(f"t{uuid.uuid4().hex[:12]}")

    return make


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, store_url_for: Callable[[str], str]) -> str:
    """An empty completion-store database of this test's own, on each backend in turn."""
    return store_url_for(request.param)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[CompletionStore]:
    """An open completion store on ``store_url``, closed after the test."""
    async with open_store(store_url, call_timeout=5.0) as opened:
        yield opened


@pytest.fixture(autouse=True)
def _pods_use_a_store_of_the_tests_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``leaseworker run`` pods a test spawns record completions in the test's own store.

    Without it, every pod started in the repository would share the default
    SQLite file there, and one test's completions would answer another's
    triggers as duplicates. A test that wants a particular store passes
    ``--store-url`` (or sets ``LEASEWORKER_STORE_URL`` itself).
    """
    monkeypatch.setenv("LEASEWORKER_STORE_URL", f"sqlite:///{tmp_path / 'pods.sqlite3'}")


@pytest.fixture(scope="session", autouse=True)
def _no_leaseworker_directory_left_behind(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Fail the session if a ``leaseworker-*`` temporary directory outlives it.

    The session gets a temporary directory of its own (``TMPDIR`` and
    ``tempfile.tempdir``, inherited by every process a test starts), so what
    concurrent sessions on the same machine create never counts. Every service
    and demo makes its work directory there; whatever is left at the end was
    leaked, and is named in the failure. pytest's own ``tmp_path`` directories
    stay where they were (its base directory is fixed before the switch).
    """
    tmp_path_factory.getbasetemp()
    private = Path(tempfile.mkdtemp(prefix="lwtests-"))
    private.chmod(0o1777)  # like /tmp: PostgreSQL's server runs as another user
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(private)
    try:
        yield
    finally:
        left = sorted(path.name for path in private.glob("leaseworker-*"))
        shutil.rmtree(private, ignore_errors=True)
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
    assert not left, f"the session left temporary directories behind: {left}"


@pytest.fixture(scope="session")
def leaseworker_stack(local_stack: LocalStack) -> LocalStack:
    """The plugin's services are the session's (one Redis, one Kafka JVM, not two)."""
    return local_stack

"""The pod's outbox settings and its backlog gauges, with real pods, PostgreSQL and Kafka.

``PodConfig.outbox_retention`` reaches the pod's relay: a sent row older
than it is deleted at the relay's first round, a younger one kept. The
backlog gauges are the store's, so one pod at a time reports them: with two
``leaseworker run`` pods every Prometheus scrape finds exactly one
``leaseworker_outbox_depth`` series, and when its pod is SIGKILLed the other
takes the reporter's lease over once it expires and reports it instead. A
series is one namespace's rows on one store, labelled by the namespace: two
namespaces sharing a store each report their own rows, and one namespace on
two stores reports each store's.
"""

from __future__ import annotations

import re
import signal
import urllib.request
from collections.abc import Callable

import anyio
import psycopg
import pytest

from leaseworker import PodConfig, open_store
from leaseworker._store import effect_store
from leaseworker._worker._backlog import EVERY
from leaseworker._worker._pod_relay import outbox_relay
from leaseworker_dev._services import LocalKafka, LocalPostgres, PodProcess, free_port

from ..waiting import eventually
from .test_effects_pods import Pods, pg_url, pods
from .test_relay import commit

__all__ = ["pg_url", "pods"]  # the fixtures, shared with test_effects_pods

_SENT_AGO = """
    WITH gone AS (
        DELETE FROM leaseworker_outbox_unsent WHERE job_key = %s RETURNING id
    )
    INSERT INTO leaseworker_outbox_sent (relay, sent_at, ids, attempts)
    SELECT 'test', now() - %s::interval, array_agg(id ORDER BY id), array_agg(1) FROM gone
"""
"""What a relay's mark records, of a key's rows, as of ``age`` ago."""
_DEPTH = re.compile(r"^leaseworker_outbox_depth\S*\s+(\S+)$", re.MULTILINE)
_LABELLED = re.compile(r"^leaseworker_outbox_depth(\S*)\s+(\S+)$", re.MULTILINE)
_NAMESPACE = re.compile(r'leaseworker_namespace="([^"]*)"')


async def test_a_pods_relay_deletes_sent_rows_older_than_its_outbox_retention(
    store_url_for: Callable[[str], str], kafka_server: LocalKafka
) -> None:
    """Retention 1 h: the row sent 2 h ago is deleted, the one sent 10 min ago kept."""
    url = store_url_for("postgresql")
    async with open_store(url) as opened:
        store = effect_store(opened)
        await commit(store, "ns:{old}", 1, b"old")
        await commit(store, "ns:{young}", 1, b"young")
        with psycopg.connect(url, autocommit=True) as conn:
            for key, age in (("ns:{old}", "2 hours"), ("ns:{young}", "10 minutes")):
                conn.execute(_SENT_AGO, (key, age))
        config = PodConfig(bootstrap_servers=kafka_server.bootstrap_servers, outbox_retention=3600)
        async with outbox_relay(opened, config) as relay:
            assert relay is not None

            async def pruned() -> bool:
                return relay.pruned > 0

            await eventually(pruned, within=10)
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT job_key FROM leaseworker_outbox").fetchall()
    assert left == [("ns:{young}",)]


def _depth(port: int) -> list[float]:
    """The ``leaseworker_outbox_depth`` values the pod's Prometheus endpoint shows now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return [float(value) for value in _DEPTH.findall(text)]


async def _reporting(ports: dict[str, int], alive: list[str]) -> list[str]:
    """The names of the live pods whose scrape shows a depth series."""
    found = []
    for name in alive:
        values = await anyio.to_thread.run_sync(_depth, ports[name])
        assert len(values) <= 1
        if values:
            found.append(name)
    return found


@pytest.mark.timeout(150)
async def test_exactly_one_pod_reports_the_backlog_and_another_takes_over_when_it_dies(
    pods: Pods,
) -> None:
    """Two pods, one series; SIGKILL its pod and the other one reports it (lease expiry)."""
    ports = {"pod-a": free_port(), "pod-b": free_port()}
    started: dict[str, PodProcess] = {}
    started["pod-a"] = await pods.spawn("pod-a", "a", "--metrics-port", str(ports["pod-a"]))

    async def only(name: str, alive: list[str]) -> bool:
        return await _reporting(ports, alive) == [name]

    await eventually(lambda: only("pod-a", ["pod-a"]), within=20)
    started["pod-b"] = await pods.spawn("pod-b", "b", "--metrics-port", str(ports["pod-b"]))
    with anyio.move_on_after(2.5 * EVERY):  # B tries the reporter's lease twice meanwhile
        while True:
            assert await _reporting(ports, ["pod-a", "pod-b"]) == ["pod-a"]
            await anyio.sleep(0.5)
    started["pod-a"].signal(signal.SIGKILL)
    await eventually(lambda: only("pod-b", ["pod-b"]), within=45)


def _series(port: int) -> list[tuple[str | None, float]]:
    """The pod's ``leaseworker_outbox_depth`` series now: (its namespace label, its value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = []
    for labels, value in _LABELLED.findall(text):
        named = _NAMESPACE.search(labels)
        found.append((named.group(1) if named else None, float(value)))
    return found


@pytest.mark.timeout(150)
async def test_each_namespace_on_each_store_reports_its_own_rows_once(
    pods: Pods, pg_url: str, postgres_server: LocalPostgres
) -> None:
    """Namespaces A and B share store 1, A also uses store 2: three series, each its own rows.

    Store 1 holds 2 unsent rows of A and 3 of B, store 2 one of A, all kept
    unsent by a row lock of the test's. Per namespace alone, A would have one
    reporter for both stores and store 1's would count B's rows too.
    """
    a, b = pods.namespace, f"{pods.namespace}b"
    other = postgres_server.create_database(f"t{pods.suffix}x")
    rows = {pg_url: {a: 2, b: 3}, other: {a: 1}}
    locks = []
    for url, per_namespace in rows.items():
        async with open_store(url) as opened:
            for namespace, count in per_namespace.items():
                for n in range(count):
                    await commit(effect_store(opened), f"{namespace}:{{k{n}}}", 1, b"x")
        locked = psycopg.connect(url)  # the relays skip locked rows: they stay unsent
        locked.execute("SELECT id FROM leaseworker_outbox FOR UPDATE").fetchall()
        locks.append(locked)
    try:
        ports = {name: free_port() for name in ("a1", "b1", "a2")}
        for name, namespace, url in (("a1", a, pg_url), ("b1", b, pg_url), ("a2", a, other)):
            await pods.spawn(
                name,
                name,
                *("--namespace", namespace, "--store-url", url),
                *("--metrics-port", str(ports[name])),
            )
        expected = {"a1": [(a, 2.0)], "b1": [(b, 3.0)], "a2": [(a, 1.0)]}

        async def reported() -> bool:
            seen = {n: await anyio.to_thread.run_sync(_series, p) for n, p in ports.items()}
            return seen == expected

        await eventually(reported, within=45)
    finally:
        for locked in locks:
            locked.close()

"""The campaign's faults on three brokers, played by its injector against a real cluster.

``broker_kill`` SIGKILLs the planned node and returns with it back and every
partition in sync; ``broker_rolling_restart`` stops (SIGTERM) and starts each
node once. Both record their window.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from leaseworker_dev._campaign._fault_play import Injector
from leaseworker_dev._campaign._plan import PlannedFault
from leaseworker_dev._campaign._testbed import Services
from leaseworker_dev._services import LocalKafkaCluster, LocalStack


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """A stack holding only the three brokers, as the campaign's ``--kafka-brokers 3`` has."""
    workdir = tmp_path_factory.mktemp("broker-faults")
    with LocalStack() as stack:
        stack.start("kafka3")
        yield Services(stack=stack, workdir=workdir, store_url=f"sqlite:///{workdir / 's.db'}")


def _cluster(services: Services) -> LocalKafkaCluster:
    assert services.kafka3 is not None
    return services.kafka3


async def test_a_broker_kill_takes_the_planned_node_and_brings_it_back_in_sync(
    services: Services,
) -> None:
    """Node index 1 (id 2) is SIGKILLed; afterwards it runs again and every ISR is full."""
    cluster = _cluster(services)
    assert services.bootstrap_servers == cluster.bootstrap_servers
    before = {node_id: node.process for node_id, node in cluster.nodes.items()}
    injector = Injector(stack=services, pods={}, lease=1.0)
    await injector.play(PlannedFault(kind="broker_kill", at=0.0, duration=0.5, size=1))
    assert before[2].popen.returncode == -signal.SIGKILL
    assert cluster.nodes[2].process is not before[2]
    assert all(cluster.nodes[i].process is before[i] for i in (1, 3))
    [window] = injector.faults
    assert (window.kind, window.attrs) == ("broker_kill", {"node": 2})
    cluster.wait_in_sync(timeout=1.0)  # already: the fault waited for it


async def test_a_rolling_restart_stops_and_replaces_every_node(services: Services) -> None:
    """Each node's process is stopped by SIGTERM (not killed) and a new one runs."""
    cluster = _cluster(services)
    before = {node_id: node.process for node_id, node in cluster.nodes.items()}
    injector = Injector(stack=services, pods={}, lease=1.0)
    await injector.play(PlannedFault(kind="broker_rolling_restart", at=0.0, duration=0.1))
    for node_id, process in before.items():
        assert process.popen.returncode not in (None, -signal.SIGKILL), node_id
        assert cluster.nodes[node_id].process is not process
    [window] = injector.faults
    assert window.kind == "broker_rolling_restart"
    cluster.wait_in_sync(timeout=1.0)

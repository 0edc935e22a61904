"""One pod end to end through every secured peer at once, on each Redis topology.

Kafka over SASL_SSL with SCRAM-SHA-512 under the pod principal's ACLs,
Redis over TLS with a client certificate as the documented ACL user (one
node, Sentinel, Cluster), PostgreSQL verify-full with SCRAM as the runtime
role, spans and metrics to an OTLP collector over HTTPS; every credential
from a file. The job writes through ``ctx.transaction()`` and publishes with
``tx.publish``: the outbox row is written as the runtime role and the relay
sends it through the pod's principal. ``trigger`` and ``inspect`` go through
the same peers.
"""

from __future__ import annotations

import json
import signal
import uuid

import psycopg
import pytest

from leaseworker._telemetry import names
from leaseworker_dev._services import PodProcess

from ..kafka_util import read_topic
from ..waiting import eventually
from .conftest import OWNER
from .stack import SecuredStack, command, start_pod


async def test_sasl_ssl_tls_a_pod_runs_a_transactional_job_through_every_secured_peer(
    stack: SecuredStack, pods: list[PodProcess]
) -> None:
    """Trigger, lease, transaction, completion, outbox relay and spans, all secured."""
    pod = start_pod(stack, f"stack-{uuid.uuid4().hex[:6]}")
    pods.append(pod)
    key = f"report:secured:{uuid.uuid4().hex[:8]}"
    argv = ("trigger", stack.names.topic, "--key", key, "--payload", "{}")
    sent = command(*argv, env=stack.producer_env())
    assert sent.code == 0, sent.stderr

    try:
        published = await read_topic(stack.kafka.broker.bootstrap_servers, stack.ready_topic, 1)
    except TimeoutError:
        pytest.fail(f"the relay sent nothing; the pod logged:\n{pod.log_text()[-4000:]}")
    assert json.loads(published[0].value) == {"job": key}

    with psycopg.connect(stack.postgres.url(OWNER)) as conn:
        completions = conn.execute(
            "SELECT count(*) FROM leaseworker_completions WHERE job_key LIKE %s", (f"%{key}%",)
        ).fetchone()
    assert completions == (1,)

    inspected = command("inspect", key, env=stack.env())
    assert inspected.code == 0, inspected.stderr
    assert json.loads(inspected.stdout)["fence"] >= 1

    async def exported() -> bool:
        wanted = {names.send_span_name(stack.names.topic), names.SPAN_ACQUIRE, names.SPAN_RUN}
        return wanted <= stack.collector.span_names()

    await eventually(exported, within=30)
    pod.signal(signal.SIGTERM)
    assert await pod.wait_exit(30) == 0, pod.log_text()[-3000:]
    assert stack.collector.bodies("/v1/metrics"), "no metrics reached the HTTPS collector"
    for secret in stack.secrets():
        assert secret not in pod.log_text()

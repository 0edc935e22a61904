"""A poll's triggers are looked up in one store call, before any takes its lease.

An in-process pod against the session's real Kafka and Redis and a real store
on each backend (the ``store_url`` fixture), with the store's ``lookup_many``
counted. The records are produced before the pod starts, so its first poll
fetches several: they share one lookup. A trigger whose identity completed
before is answered ``duplicate`` without the lease; a second record of an
identity in the same poll waits behind the first and is answered
``duplicate`` without the lease too (its own lookup, after the first completed).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from leaseworker import Completion, CompletionRequest, CompletionStore
from leaseworker._execution import completion_key
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, committed, payload, produce
from ..waiting import eventually
from ..worker_util import make_worker, pod_config, running
from .test_completion_worker import Events


async def test_a_polls_triggers_share_one_lookup_and_duplicates_take_no_lease(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    store: CompletionStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six records in one poll: one lookup call; the done one and the repeat run no lease."""
    done = await store.complete(
        CompletionRequest(
            job_key=completion_key(namespace, "done"),
            input_version="v1",
            fence=1,
            result={"earlier": True},
            execution_id="earlier",
            pod="pod-z",
        )
    )
    assert done.status == "accepted"
    calls: list[int] = []
    answers = store.settled_by_offsets()  # the store as the pod's executions ask it
    inner = answers.lookup_many

    async def counted(identities: Sequence[tuple[str, str]]) -> list[Completion | None]:
        calls.append(len(identities))
        return await inner(identities)

    monkeypatch.setattr(answers, "lookup_many", counted)
    records = [
        (b"done", payload(inputVersion="v1")),
        (b"k1", payload(inputVersion="v1")),
        (b"k2", payload(inputVersion="v1")),
        (b"twice", payload(inputVersion="v1")),
        (b"k3", payload(inputVersion="v1")),
        (b"twice", payload(inputVersion="v1")),  # the producer retried it
    ]
    await produce(kafka_server.bootstrap_servers, topic, records)
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    events = Events()
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, concurrency=8)
    async with running(make_worker(job, config, store=store, hooks=[events])):

        async def all_committed() -> bool:
            found = await committed(kafka_server.bootstrap_servers, kafka_names.group, topic)
            return found == {0: len(records)}

        await eventually(all_committed, within=20)
    assert max(calls) > 1  # the poll's first-in-line triggers, in one call
    assert sum(calls) == 6  # five of the poll's six, and the repeat after the first completed
    started = [e.job_key for e in events.seen if e.event == "started"]
    assert sorted(started) == ["k1", "k2", "k3", "twice"]  # no lease for either duplicate
    assert events.finished("done") == [("duplicate", None)]
    assert events.finished("twice") == [("completed", None), ("duplicate", None)]
    assert recorder.runs_of("done") == []
    assert len(recorder.runs_of("twice")) == 1

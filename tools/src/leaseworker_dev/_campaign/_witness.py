"""Reading the independent witnesses after a campaign: Kafka's offsets and dead letters, the store.

The checker trusts these over the pods' own account: the group's committed
positions come from the broker, the dead letters from their topic (their
``leaseworker.*`` headers), the completions from the store itself. The pods'
own history (:func:`pods_history`) is merged here too, with the faults, and
each execution a kill ended or a freeze struck marked so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient  # type: ignore[import-untyped]

from leaseworker.toolkit import (
    Execution,
    FaultWindow,
    History,
    KafkaSecurity,
    completion_key,
    header_line,
    merge,
    open_store,
)

from .._services import PodProcess
from ._campaign_records import DeadLetter, Marked, Stored
from ._stall import stall_log

TIMEOUT = 30.0
"""Seconds any one read may take."""

FROZEN_FAULTS = frozenset({"pod_pause", "loop_stall"})
"""Faults that freeze a pod's executions: those count as paused."""


async def committed(
    bootstrap: str, group: str, topic: str, security: KafkaSecurity | None = None
) -> dict[int, int]:
    """Return the group's committed position per partition of ``topic``."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=10_000, **_kwargs(security)
    )
    with anyio.fail_after(TIMEOUT):
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


async def dead_letters(
    bootstrap: str, topic: str, security: KafkaSecurity | None = None
) -> tuple[DeadLetter, ...]:
    """Read every record of the dead-letter ``topic`` and decode where it came from and why."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **_kwargs(security),
    )
    letters: list[DeadLetter] = []
    found = await _partitions(bootstrap, topic, security)
    partitions = [TopicPartition(topic, p) for p in found]
    with anyio.fail_after(TIMEOUT):
        await consumer.start()
        try:
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            ends = await consumer.end_offsets(partitions)
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                batch = await consumer.getmany(timeout_ms=500)
                letters += [_letter(r) for records in batch.values() for r in records]
        finally:
            await consumer.stop()
    return tuple(letters)


def _kwargs(security: KafkaSecurity | None) -> dict[str, Any]:
    """Return aiokafka's SASL/TLS keyword arguments (none for a plaintext broker)."""
    return (security or KafkaSecurity()).client_kwargs()


async def _partitions(bootstrap: str, topic: str, security: KafkaSecurity | None) -> list[int]:
    """Return the partitions of ``topic`` (a fresh consumer's metadata may not know them yet)."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=10_000, **_kwargs(security)
    )
    with anyio.fail_after(TIMEOUT):
        await admin.start()
        try:
            [described] = await admin.describe_topics([topic])
        finally:
            await admin.close()
    return sorted(int(p["partition"]) for p in described["partitions"]) or [0]


def _letter(record: object) -> DeadLetter:
    headers = {k: (v or b"").decode(errors="replace") for k, v in getattr(record, "headers", ())}
    return DeadLetter(
        partition=int(headers.get("leaseworker.original.partition", "-1")),
        offset=int(headers.get("leaseworker.original.offset", "-1")),
        reason=headers.get("leaseworker.error", ""),
        job_key=headers.get("leaseworker.job.key"),
    )


async def completions(
    store_url: str, namespace: str, identities: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], Stored]:
    """Return the stored completion of each identity that has one."""
    found: dict[tuple[str, str], Stored] = {}
    async with open_store(store_url) as store:
        for job_key, version in identities:
            done = await store.lookup(completion_key(namespace, job_key), version)
            if done is not None:
                found[(job_key, version)] = Stored(fence=done.fence, execution_id=done.execution_id)
    return found


def marks(directory: Path) -> tuple[Marked, ...]:
    """Summarise the marks files in ``directory`` (one per execution id): per process, the last.

    A line cut short by a kill mid-write is skipped; a file is read line by
    line (a long CPU-bound execution leaves thousands).
    """
    found: list[Marked] = []
    if not directory.is_dir():
        return ()
    for path in sorted(directory.iterdir()):
        seen: dict[int, list[float]] = {}  # pid -> [count, first, last]
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                parts = line.split()
                if len(parts) != 2 or not line.endswith("\n"):
                    continue
                pid, at = int(parts[0]), float(parts[1])
                entry = seen.setdefault(pid, [0.0, at, at])
                entry[0] += 1
                entry[2] = max(entry[2], at)
        found += [
            Marked(execution_id=path.name, pid=pid, count=int(n), first=first, last=last)
            for pid, (n, first, last) in seen.items()
        ]
    return tuple(found)


def pods_history(pods: dict[str, PodProcess], faults: list[FaultWindow], workdir: Path) -> History:
    """Merge the pods' histories with the faults; close what a kill ended; mark the paused."""
    parts = [pod.recorded() for pod in pods.values()]
    all_faults = list(faults)
    for pod in pods.values():
        log = stall_log(workdir, pod.name)
        if log.exists():
            all_faults += History.from_json(header_line("monotonic") + log.read_text()).faults
    merged = merge(parts)
    deaths = {
        pod.name: sorted(at for code, killed, at in pod.exits if killed or code != 0)
        for pod in pods.values()
    }
    executions = tuple(_judged(e, deaths.get(e.pod, []), all_faults) for e in merged.executions)
    return History(clock="monotonic", executions=executions, faults=tuple(all_faults))


def _judged(execution: Execution, deaths: list[float], faults: list[FaultWindow]) -> Execution:
    if execution.end is None:
        died = next((at for at in deaths if at > execution.start), None)
        if died is not None:
            execution = dataclasses.replace(execution, end=died, outcome="killed")
    end = execution.end if execution.end is not None else float("inf")
    since = min(execution.start, _expiry(execution))
    frozen = any(
        f.kind in FROZEN_FAULTS
        and f.target == execution.pod
        and f.start < end
        and (f.end if f.end is not None else f.start) > since
        for f in faults
    )
    return dataclasses.replace(execution, paused=True) if frozen else execution


def _expiry(execution: Execution) -> float:
    """When Redis could expire the execution's lease, from its stop (``inf``: not known).

    Before ``start`` when the pod froze between sending the acquire and
    reading its answer: the execution starts only after the freeze, its lease
    already run out, and the freeze is what kept it from stopping in time.
    """
    for step in execution.steps:
        if step.name == "stopped" and "margin_ms" in step.attrs:
            return step.at + float(step.attrs["margin_ms"]) / 1000
    return float("inf")

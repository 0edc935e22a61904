"""Completion identity and ``ctx.complete`` semantics, on a real lease and a real SQLite store."""

from __future__ import annotations

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import JobContext, LeaseLost, RedisLeases, ReportJob, hold, open_store
from leaseworker._execution import Trigger, completion_key, decode_trigger
from leaseworker._execution._completion import Completer, default_input_version

from ..waiting import eventually


def _trigger(value: bytes) -> Trigger:
    return decode_trigger(topic="t", partition=0, offset=7, key=b"k", value=value)


class _Job(ReportJob):
    topic = "t"

    async def run(self, ctx: JobContext) -> object:
        return None


def test_default_input_version_hashes_the_canonical_payload() -> None:
    """Key order and whitespace do not change the version; any input value does."""
    one = default_input_version(_trigger(b'{"tenant": "acme", "period": "2026-11"}'))
    same = default_input_version(_trigger(b'{"period":"2026-11","tenant":"acme"}'))
    other = default_input_version(_trigger(b'{"tenant": "acme", "period": "2026-12"}'))
    assert one == same != other
    assert one.startswith("sha256:")
    assert len(one) == len("sha256:") + 64


def test_a_declared_string_input_version_wins_and_the_job_may_override() -> None:
    """``inputVersion`` (a non-empty string) is used as is; a non-string is hashed with the rest."""
    job = _Job()
    assert job.input_version(_trigger(b'{"inputVersion": "snap-42", "x": 1}')) == "snap-42"
    assert job.input_version(_trigger(b'{"inputVersion": 42}')).startswith("sha256:")

    class BySnapshot(_Job):
        def input_version(self, trigger: Trigger) -> str:
            return str(trigger.payload["snapshot"])

    assert BySnapshot().input_version(_trigger(b'{"snapshot": 9, "requestId": "r1"}')) == "9"


def test_completion_keys_are_scoped_by_namespace_like_lease_keys() -> None:
    """Fences of different namespaces come from different counters: never one store key."""
    assert completion_key("ns", "report:a") == "ns:{report:a}"
    assert completion_key("ns:x", "y") != completion_key("ns", "x:y")


async def test_complete_records_once_and_a_second_call_is_a_clear_error(
    leases: RedisLeases,
) -> None:
    """One execution, one completion: the second ``ctx.complete`` raises, nothing changes."""
    trigger = _trigger(b"{}")
    async with (
        open_store("sqlite:///:memory:") as store,
        hold(leases, "k", lease_duration=4) as held,
    ):
        completer = Completer(
            store, held, key="ns:{k}", input_version="v1", execution_id="e1", pod="p"
        )
        ctx = JobContext(
            held=held, job_key="k", execution_id="e1", pod="p", trigger=trigger, completer=completer
        )
        first = await ctx.complete({"n": 1})
        with pytest.raises(RuntimeError, match="already called"):
            await ctx.complete({"n": 2})
        state = await store.state("ns:{k}")
    assert first.status == "accepted"
    assert first.fence == held.fence
    assert state is not None
    assert state.result == {"n": 1}


async def test_a_loss_the_worker_already_saw_refuses_before_writing(
    leases: RedisLeases, redis: Redis
) -> None:
    """The lease layer refuses a known loss: LeaseLost, and the store holds nothing."""
    trigger = _trigger(b"{}")
    async with open_store("sqlite:///:memory:") as store:
        with pytest.raises(LeaseLost):
            async with hold(leases, "k", lease_duration=3, renewal_interval=0.3) as held:
                completer = Completer(
                    store, held, key="ns:{k}", input_version="v1", execution_id="e1", pod="p"
                )
                ctx = JobContext(
                    held=held,
                    job_key="k",
                    execution_id="e1",
                    pod="p",
                    trigger=trigger,
                    completer=completer,
                )
                await redis.delete(leases.lease_key("k"))

                async def loss_seen() -> bool:
                    return not held.owned

                with anyio.CancelScope(shield=True):  # wait for the renewal to see it
                    await eventually(loss_seen, within=3)
                await ctx.complete({"n": 1})
        assert await store.state("ns:{k}") is None
    assert completer.result is None


async def test_a_context_without_a_store_says_so(leases: RedisLeases) -> None:
    """A hand-built JobContext (no worker, no store) cannot complete: a clear error."""
    async with hold(leases, "k", lease_duration=4) as held:
        ctx = JobContext(held=held, job_key="k", execution_id="e", pod="p", trigger=_trigger(b"{}"))
        with pytest.raises(RuntimeError, match="no completion store"):
            await ctx.complete(None)

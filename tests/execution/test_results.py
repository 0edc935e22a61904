"""Results are checked before the store sees them: a bad one is ``bad_result``, said plainly.

Against real Redis and each real completion store: a job that *returned* a
result no store keeps ends ``failed`` with reason ``bad_result`` and a detail
naming the problem (never "the job raised TypeError"), and nothing is stored.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from leaseworker import (
    BadResult,
    CompletionStore,
    Event,
    ExecutionEvent,
    JobContext,
    RedisLeases,
    ReportJob,
)
from leaseworker._execution import Executor, completion_key, decode_trigger
from leaseworker._execution._completion import default_input_version
from leaseworker._execution._result_checks import check_result

BAD: list[tuple[object, str]] = [
    ({"when": datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)}, "datetime"),
    ({"ids": {1, 2}}, "set"),
    (b"raw", "bytes"),
    ({"ratio": float("nan")}, "nan"),
    ([float("inf")], "inf"),
    ({1: "a"}, "int mapping key"),
    ({"name": "a\x00b"}, "NUL"),
    ("x" * 100, "limit 64"),
]


class _Returns(ReportJob):
    """Returns the result the test puts on the class."""

    topic = "t"
    max_result_bytes = 64
    result: Any = None

    async def run(self, ctx: JobContext) -> object:
        return self.result


class _Events:
    def __init__(self) -> None:
        self.events: list[ExecutionEvent] = []

    def __call__(self, event: Event) -> None:
        if not isinstance(event, ExecutionEvent) or event.event == "acquiring":
            return
        self.events.append(event)


@pytest.mark.parametrize("store_url", ["memory", "sqlite"], indirect=True)
@pytest.mark.parametrize(("result", "said"), BAD)
async def test_a_returned_result_no_store_keeps_ends_bad_result_and_is_not_stored(
    leases: RedisLeases, store: CompletionStore, result: object, said: str
) -> None:
    """The ending and the ``finished`` event say ``bad_result``; the store holds nothing."""
    job = type("Job", (_Returns,), {"result": result})()
    events = _Events()
    executor = Executor(job, leases, pod="pod-a", hooks=[events], store=store)
    trigger = decode_trigger(topic="t", partition=0, offset=1, key=b"report:r", value=b"{}")
    ending = await executor.run(trigger, "report:r")
    assert (ending.outcome, ending.reason, ending.dead_letter) == (
        "failed",
        "bad_result",
        "bad_result",
    )
    assert ending.detail is not None
    assert said in ending.detail
    assert "raised" not in ending.detail
    [finished] = [e for e in events.events if e.event == "finished"]
    assert (finished.outcome, finished.reason) == ("failed", "bad_result")
    assert isinstance(finished.error, BadResult)
    key = completion_key("leaseworker", "report:r")
    assert await store.lookup(key, default_input_version(trigger)) is None


class _CorrectsItself(ReportJob):
    topic = "t"

    async def run(self, ctx: JobContext) -> object:
        try:
            await ctx.complete({"at": datetime.date(2026, 12, 1)})
        except BadResult:
            await ctx.complete({"at": "2026-12-01"})  # the refused call did not count
        return None


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_job_told_bad_result_by_complete_may_complete_again(
    leases: RedisLeases, store: CompletionStore
) -> None:
    """``ctx.complete`` raises BadResult before the store is called; a second call is accepted."""
    executor = Executor(_CorrectsItself(), leases, pod="pod-a", hooks=[_Events()], store=store)
    trigger = decode_trigger(topic="t", partition=0, offset=1, key=b"report:c", value=b"{}")
    ending = await executor.run(trigger, "report:c")
    assert ending.outcome == "completed"
    key = completion_key("leaseworker", "report:c")
    completion = await store.lookup(key, default_input_version(trigger))
    assert completion is not None
    assert completion.result == {"at": "2026-12-01"}


@pytest.mark.fake
@pytest.mark.parametrize(
    "result",
    [None, 0, 1.5, True, "é", [1, [2, (3,)]], {"a": {"b": [None, {"c": "d"}]}}, "x" * 62],
)
def test_json_results_within_the_bound_pass(result: object) -> None:
    """Every JSON shape, tuples included, up to exactly the bound (64 bytes: '"' + 62 + '"')."""
    check_result("k", result, max_bytes=64)


@pytest.mark.fake
def test_a_result_nested_too_deeply_is_bad_result_not_a_crash() -> None:
    """Nesting that would exhaust the encoder's recursion is a BadResult."""
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(BadResult, match="nested too deeply"):
        check_result("k", deep, max_bytes=1 << 30)

"""The timeline of a real story, drawn from a real Jaeger and looked at in a real browser.

Two ``leaseworker run`` pods share Redis and a SQLite completion store, each
on a topic of its own (so the test decides who gets which trigger). Pod A
starts the report and then blocks its event loop; the test SIGSTOPs it past
its lease. Pod B takes the job key over and completes it; A wakes, tries to
complete and gets ``stale``. This is the one overlap leaseworker cannot
prevent (a lease cannot stop a frozen process) and the fence makes harmless,
so its timeline has everything: two lanes, a takeover that links to the
execution it succeeded, an overlap, an accepted and a stale completion.
Both pods export their spans to a private Jaeger; ``leaseworker timeline``
finds them by the job key and writes the page, which headless Chromium draws.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from leaseworker import JobContext, ReportJob
from leaseworker._timeline import JaegerQuery, history_from_spans, render_text
from leaseworker.toolkit import History
from leaseworker_dev._demos import pod_environment
from leaseworker_dev._services import LocalJaeger, LocalKafka, LocalRedis, PodProcess

from ..kafka_util import produce
from ..pods import LEASEWORKER, REPO, ready, spawn
from ..waiting import eventually
from .browser import probe, screenshot

LEASE = 2.0
SERVICE = "timeline-e2e"


class FreezingReport(ReportJob):
    """Marks its start, sleeps ``seconds``, blocks the loop until ``wait_for`` exists, completes.

    (Both payload fields are optional.)
    """

    topic = os.environ.get("LW_TEST_TOPIC", "unset")
    lease_duration = LEASE

    async def run(self, ctx: JobContext) -> object:
        """Start, maybe block without awaiting (a job stuck in a blocking call), complete."""
        with open(os.environ["LW_TEST_MARKERS"], "a") as markers:  # noqa: ASYNC230 - tiny
            markers.write(f"start {ctx.pod}\n")
        await anyio.sleep(float(ctx.trigger.payload.get("seconds", 0)))  # renewing meanwhile
        await ctx.checkpoint()  # the last one: past it, nothing on this side notices a loss
        wait_for = ctx.trigger.payload.get("wait_for")
        if isinstance(wait_for, str):
            while not os.path.exists(wait_for):  # noqa: ASYNC240 - blocking on purpose
                time.sleep(0.01)  # noqa: ASYNC251 - the point: a job that does not await
        await ctx.complete({"pod": ctx.pod})
        return None


@pytest.fixture
def jaeger(tmp_path: Path) -> Iterator[LocalJaeger]:
    """A private Jaeger (cached build) for this test."""
    instance = LocalJaeger.start(workdir=tmp_path / "jaeger")
    try:
        yield instance
    finally:
        instance.stop()


def _spawn(
    name: str, workdir: Path, topic: str, argv: list[str], env: dict[str, str]
) -> PodProcess:
    markers = {"LW_TEST_TOPIC": topic, "LW_TEST_MARKERS": str(workdir / "markers.txt")}
    return spawn(
        name, f"{__name__}:FreezingReport", workdir, {**env, **markers}, *argv, evidence=True
    )


def _started(workdir: Path, pod: str) -> bool:
    path = workdir / "markers.txt"
    return path.exists() and f"start {pod}" in path.read_text().splitlines()


async def _paused_takeover(
    kafka: LocalKafka, redis: LocalRedis, jaeger: LocalJaeger, workdir: Path, key: str
) -> None:
    """Play the story (see the module docstring); every pod is stopped before it returns."""
    suffix = uuid.uuid4().hex[:10]
    topics = {"pod-a": f"timeline-a-{suffix}", "pod-b": f"timeline-b-{suffix}"}
    kafka.create_topics(list(topics.values()))
    common = [
        *("--bootstrap-servers", kafka.bootstrap_servers, "--redis-url", redis.url),
        *("--namespace", f"t{suffix}", "--store-url", f"sqlite:///{workdir / 'store.sqlite3'}"),
        *("--session-timeout", "30"),  # the pause must not turn into a rebalance
    ]
    env = pod_environment(jaeger, SERVICE)
    pods = {
        name: _spawn(name, workdir, topic, [*common, "--pod", name, "--group", f"g-{topic}"], env)
        for name, topic in topics.items()
    }
    a, go = pods["pod-a"], workdir / "go"
    try:

        async def joined() -> bool:
            return all([await ready(pod) for pod in pods.values()])

        await eventually(joined, within=45)
        request_a = json.dumps({"inputVersion": "a", "wait_for": str(go)}).encode()
        await produce(kafka.bootstrap_servers, topics["pod-a"], [(key.encode(), request_a)])

        async def a_started() -> bool:
            return _started(workdir, "pod-a")

        await eventually(a_started, within=20)
        a.signal(signal.SIGSTOP)
        request_b = json.dumps({"inputVersion": "b", "seconds": 1.5}).encode()
        await produce(kafka.bootstrap_servers, topics["pod-b"], [(key.encode(), request_b)])

        async def b_completed() -> bool:
            return "finished job" in pods["pod-b"].log_text()

        await eventually(b_completed, within=30)
        go.touch()
        a.signal(signal.SIGCONT)

        async def a_stale() -> bool:
            return "lost (stale)" in a.log_text()

        await eventually(a_stale, within=20)
    finally:
        if a.process.poll() is None:
            a.signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
        for pod in pods.values():
            if pod.process.poll() is None:
                pod.signal(signal.SIGTERM)  # flushes its spans to Jaeger
        with anyio.move_on_after(30):
            for pod in pods.values():
                await pod.wait_exit(30)
        for pod in pods.values():
            pod.kill()


async def _history_in_jaeger(jaeger: LocalJaeger, key: str) -> History:
    """Wait until Jaeger has both executions with their completion answers; return the history."""
    query = JaegerQuery(jaeger.query_url, service=SERVICE)
    history = History()

    async def complete() -> bool:
        nonlocal history
        found = await anyio.to_thread.run_sync(lambda: query.job_key(key, since=600))
        history = history_from_spans(found.spans, key)
        return sorted(e.completion or "" for e in history.executions) == ["accepted", "stale"]

    try:
        await eventually(complete, within=30)
    except TimeoutError:
        raise AssertionError(f"Jaeger holds only:\n{render_text(history)}") from None
    return history


def _story(history: History) -> list[tuple[object, ...]]:
    """What a history says, without its times (v1 answers in µs, v3 in ns)."""
    return [
        (
            *(e.execution_id, e.pod, e.fence, e.outcome, e.completion, e.previous_execution_id),
            *(step.name for step in e.steps),
        )
        for e in history.executions
    ]


async def test_the_timeline_of_a_paused_takeover_is_drawn_from_jaeger_in_a_browser(
    kafka_server: LocalKafka, redis_server: LocalRedis, jaeger: LocalJaeger, tmp_path: Path
) -> None:
    """Lanes, bars, the takeover link and the overlap marker are drawn from the real trace.

    The history read from Jaeger has A (lost, stale) and B (completed,
    accepted, its acquire linked to A), overlapping while A was frozen;
    ``leaseworker timeline KEY --html`` prints it in 100 columns and writes the
    page; Chromium lays out one lane per pod, a bar per execution and a
    visible overlap mark, and hovering a bar shows its attributes.
    """
    key = "report:acme:2026-11"
    await _paused_takeover(kafka_server, redis_server, jaeger, tmp_path, key)
    history = await _history_in_jaeger(jaeger, key)
    by_pod = {e.pod: e for e in history.executions}
    assert set(by_pod) == {"pod-a", "pod-b"}
    a, b = by_pod["pod-a"], by_pod["pod-b"]
    assert (a.outcome, a.completion, b.outcome, b.completion) == (
        "lost",
        "stale",
        "completed",
        "accepted",
    )
    assert b.previous_execution_id == a.execution_id  # the note A left with the lease
    assert a.fence is not None
    assert b.fence is not None
    assert b.fence > a.fence
    assert b.start < (a.end or 0)  # B ran while A was frozen, believing it still held the lease
    assert any(step.name == "committed" for step in b.steps)
    v3 = JaegerQuery(jaeger.query_url, service=SERVICE, api="v3").job_key(key, since=600)
    assert v3.api == "/api/v3/traces"
    assert _story(history_from_spans(v3.spans, key)) == _story(history)  # either API

    page = tmp_path / "timeline.html"
    shown = subprocess.run(  # noqa: ASYNC221 - the command under test, bounded by its timeout
        [
            *(LEASEWORKER, "timeline", key, "--jaeger", jaeger.query_url),
            *("--service", SERVICE, "--since", "10m", "--html", str(page)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    *lines, written = shown.stdout.splitlines()
    assert written == f"HTML timeline written to {page}"
    assert max(len(line) for line in lines) <= 100
    assert lines[0].startswith(f"timeline of {key}: 2 executions on 2 pods")
    assert lines[1].startswith("overlap: ")
    assert "EXECUTIONS OVERLAPPED" in lines[1]
    assert any(line.startswith("pod-a ") for line in lines)
    assert any(line.startswith("overlap ") and "^" in line for line in lines)

    drawn = probe(page)
    assert [lane["pod"] for lane in drawn["lanes"]] == ["pod-a", "pod-b"]
    svg = drawn["svg"]
    for lane in drawn["lanes"]:
        assert lane["box"]["w"] > 0.9 * svg["w"]
        assert lane["box"]["h"] > 0
    assert sorted(bar["cls"] for bar in drawn["bars"]) == [
        "bar outcome-completed",
        "bar outcome-lost",
    ]
    for bar in drawn["bars"]:
        assert bar["box"]["w"] > 10
        assert (
            svg["x"] <= bar["box"]["x"] <= bar["box"]["x"] + bar["box"]["w"] <= svg["x"] + svg["w"]
        )
    assert drawn["overlaps"]
    assert all(mark["w"] > 0 and mark["h"] > 0 for mark in drawn["overlaps"])
    assert "executions overlapped" in drawn["overlapText"]
    assert "step step-completion status-stale" in drawn["steps"]
    assert "step step-completion status-accepted" in drawn["steps"]
    assert drawn["takeovers"] == 1
    assert "fence: " in drawn["details"]  # the hover filled the details panel
    png = tmp_path / "timeline.png"
    screenshot(page, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

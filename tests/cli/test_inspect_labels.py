"""What ``inspect`` and the owner token say is true: the pod's name, a masked secret, a hint.

A pod's owner token is ``<pod>:<random>`` (docs/workers.md, ``--pod``);
``inspect`` shows it as ``<pod>:***`` because the random part lets whoever
knows it renew or release the lease (docs/operations.md, "What never leaves
the pod"); a store that was never written is named on stderr.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest
from redis.asyncio import Redis

from leaseworker import LeaseInfo, RedisLeases
from leaseworker._cli import main
from leaseworker_dev._services import LocalKafka, LocalRedis

from ..jobs import GateJob, Recorder, on_topic
from ..kafka_util import KafkaNames, payload, produce
from ..worker_util import make_worker, pod_config, running


async def test_a_pods_owner_token_is_its_name_plus_randomness_and_inspect_masks_it(
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    redis: Redis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """While pod ``pod-labels`` holds a key, Redis has ``pod-labels:<96 random bits>``.

    ``inspect`` prints ``pod-labels:***`` and the token appears nowhere in its output.
    """
    recorder = Recorder()
    job = on_topic(GateJob, topic)(recorder)
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, pod="pod-labels")
    await produce(kafka_server.bootstrap_servers, topic, [(b"report:held", payload(gate=True))])
    async with running(make_worker(job, config)):
        await recorder.until(lambda: bool(recorder.runs_of("report:held")))
        held = await redis.get(RedisLeases(redis, namespace=namespace).lease_key("report:held"))
        argv = ["inspect", "report:held", "--redis-url", redis_server.url]
        argv += ["--namespace", namespace, "--store-url", "memory://"]
        code = await anyio.to_thread.run_sync(main, argv)
        recorder.gate("report:held").set()
    assert isinstance(held, bytes)
    token = held.decode()
    assert re.fullmatch(r"pod-labels:[0-9a-f]{24}", token), token
    assert code == 0
    out, _ = capsys.readouterr()
    shown = json.loads(out)
    assert shown["owner"] == "pod-labels:***"
    assert token.rpartition(":")[2] not in out
    assert shown["fence"] >= 1


@pytest.mark.fake
@pytest.mark.parametrize(
    ("owner", "holder"),
    [("pod-a:0123abcd", "pod-a:***"), ("host:42:0123abcd", "host:42:***"), ("bare", "***")],
)
def test_holder_keeps_the_prefix_and_masks_the_random_part(owner: str, holder: str) -> None:
    """Only the text after the last colon is secret; a token without one is all secret."""
    assert LeaseInfo(key="k", owner=owner, ttl=1.0, fence=1).holder == holder
    assert LeaseInfo(key="k", owner=None, ttl=None, fence=None).holder is None


def test_inspect_says_when_the_default_store_was_never_written(
    redis_server: LocalRedis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run where no pod ran: ``completion`` is null and stderr names the missing file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LEASEWORKER_STORE_URL")
    assert main(["inspect", "k", "--redis-url", redis_server.url]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["completion"] is None
    [line] = err.splitlines()
    assert line.startswith("leaseworker inspect: note: no completion store at ")
    assert str(tmp_path / "leaseworker-completions.sqlite3") in line
    assert "--store-url" in line
    assert not list(tmp_path.iterdir())  # and looking created nothing


def test_inspect_says_a_memory_store_cannot_be_seen_from_outside(
    redis_server: LocalRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    """``memory://`` lives in each pod: ``null``, and a note saying why."""
    assert main(["inspect", "k", "--redis-url", redis_server.url, "--store-url", "memory://"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["completion"] is None
    assert err.startswith("leaseworker inspect: note: memory:// lives inside each pod")

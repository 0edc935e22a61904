"""The README's job example runs as written, in a real pod, so it cannot rot.

The ``python`` block under "Writing a job" is read from README.md and
imported as the module ``reports`` it names itself. The class runs unchanged;
a subclass only points it at this test's topic (the README's is
``reports.requested``). One trigger with the README's payload must complete
with the result the README's ``run`` computes, recorded in the store under its
fence.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseworker import ReportJob, open_store
from leaseworker._execution import completion_key
from leaseworker_dev._services import LocalKafka, LocalRedis

from .jobs import on_topic
from .kafka_util import KafkaNames, produce
from .worker_util import Progress, make_worker, pod_config, running

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_job_example() -> str:
    """Return the first ``python`` block of README.md's "Writing a job" section."""
    section = README.read_text().split("\n## Writing a job\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert found is not None, "README.md's 'Writing a job' has no python block"
    return found.group(1)


@pytest.fixture
def reports() -> Iterator[types.ModuleType]:
    """The README block, executed as the module ``reports`` (as ``reports:MonthlyReport``)."""
    source = readme_job_example()
    assert source.startswith("# reports.py\n")
    module = types.ModuleType("reports")
    sys.modules["reports"] = module
    try:
        exec(compile(source, str(README), "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules["reports"]


async def test_the_readme_job_runs_in_a_pod_and_records_its_result(
    reports: types.ModuleType,
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    kafka_names: KafkaNames,
    namespace: str,
    topic: str,
    tmp_path: Path,
) -> None:
    """The README's trigger completes: its job key, its total, its fence in the store."""
    job_class: type[ReportJob] = reports.MonthlyReport
    assert job_class.topic == "reports.requested"
    store_url = f"sqlite:///{tmp_path / 'completions.sqlite3'}"
    config = pod_config(kafka_server, redis_server, kafka_names, namespace, store_url=store_url)
    request = b'{"tenant": "acme", "period": "2026-11"}'  # the README's `trigger` payload
    await produce(kafka_server.bootstrap_servers, topic, [(b"report:acme:2026-11", request)])
    progress = Progress()
    async with running(
        make_worker(on_topic(job_class, topic)(), config, hooks=[progress])
    ) as worker:
        await progress.until(lambda: worker.stats.commits >= 1, timeout=30)
    async with open_store(store_url) as store:
        completion = await store.state(completion_key(namespace, "report:acme:2026-11"))
    assert completion is not None
    assert completion.result == {"total": sum(range(100_000)), "fence": completion.fence}

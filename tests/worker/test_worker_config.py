"""Settings are checked when built: PodConfig, ReportJob lease settings, Backoff."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import random

import pytest

from leaseworker import (
    Backoff,
    ConfigError,
    JobContext,
    Pod,
    PodConfig,
    RedisLeases,
    ReportJob,
)
from leaseworker._kafka import SEND_TIMEOUT
from leaseworker._lease import DeadlinePolicy
from leaseworker._worker import _config

from .. import bad_jobs

pytestmark = pytest.mark.fake


@pytest.mark.parametrize(
    "settings",
    [
        {"concurrency": 0},
        {"shutdown_timeout": 0},
        {"session_timeout": 6, "heartbeat_interval": 6},
        {"redis_url": "http://x"},
        {"group": ""},
        {"dead_letter_topic": ""},
        {"kafka_timeout": 5, "revoke_timeout": 10},
        {"max_poll_interval": 0.3, "poll_timeout": 0.2},
        {"shutdown_timeout": float("inf")},  # a drain that never ends
        {"store_timeout": float("nan")},
        {"heartbeat_interval": 0},  # a heartbeat every millisecond
        {"heartbeat_interval": -1},
        {"redis_url": "redis://:pw@127.0.0.1:notaport/0"},  # redis-py's ValueError, at start
        {"loss_budget": 0},
        {"max_result_bytes": 0},
        {"outbox_retention": 0},  # every sent row deleted at once
        {"outbox_claim_timeout": float("inf")},  # a dead pod's messages never taken over
        {"outbox_relay_connections": 0},  # a relay that can never claim
        {"outbox_relay_connections": 11},  # more than the pod's pool
    ],
)
def test_settings_that_break_a_guarantee_are_config_errors(settings: dict[str, object]) -> None:
    """Each bad setting fails at construction with ConfigError, not at the first trigger."""
    with pytest.raises(ConfigError):
        PodConfig(**settings)  # type: ignore[arg-type]


def test_an_outbox_claim_must_outlast_the_relays_send_bound() -> None:
    """A claim that can lapse while its round still sends is refused, with the bound named.

    The bound is the producer's start and one wave of sends (``SEND_TIMEOUT``
    each) and the mark (``store_timeout``): 25 s by default, under the 30 s claim.
    """
    assert PodConfig().outbox_send_bound == pytest.approx(2 * SEND_TIMEOUT + 5.0)
    assert PodConfig(outbox_claim_timeout=25.5).outbox_claim_timeout == 25.5
    with pytest.raises(ConfigError, match=r"outbox_claim_timeout=25.0s must exceed .* \(25.0s"):
        PodConfig(outbox_claim_timeout=25.0)
    with pytest.raises(ConfigError, match=r"send bound \(32.0s"):
        PodConfig(store_timeout=12.0)  # the default claim no longer outlasts the mark's bound


def test_the_rebalance_timeout_covers_the_revoke_callback() -> None:
    """The group waits long enough for revoke_timeout, lease releases and a commit."""
    config = PodConfig(revoke_timeout=4, redis_timeout=0.5, commit_timeout=3)
    assert config.rebalance_timeout == pytest.approx(4 + 1 + 3 + 1)
    assert config.kafka_timeout > config.rebalance_timeout
    assert config.heartbeat == config.session_timeout / 5


def test_logs_show_redis_host_and_port_never_the_password() -> None:
    """redacted_redis() drops credentials from the URL."""
    config = PodConfig(redis_url="redis://user:hunter2@redis.internal:6380/0")
    assert config.redacted_redis() == "redis.internal:6380"


def test_every_setting_is_documented_where_it_is_declared() -> None:
    """Each PodConfig field is followed by its own docstring (no paragraph to update)."""
    module = ast.parse(inspect.getsource(_config))
    [node] = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "PodConfig"]
    documented = {
        statement.target.id
        for statement, following in zip(node.body, node.body[1:], strict=False)
        if isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
        and isinstance(following.value.value, str)
    }
    assert documented == {f.name for f in dataclasses.fields(PodConfig)}


def test_views_by_concern_read_the_flat_fields_and_hide_the_urls() -> None:
    """Each view's field holds the PodConfig attribute of its name; URLs stay out of reprs."""
    config = PodConfig(
        redis_url="redis://:hunter2@redis:6379/0",
        store_url="postgresql://lw:hunter2@db/reports",
        revoke_timeout=4,
        session_timeout=20,
        dead_letter_topic="dead",
    )
    views: list[
        _config.KafkaSettings
        | _config.GroupTiming
        | _config.Timeouts
        | _config.LeaseSettings
        | _config.StoreSettings
    ] = [config.kafka, config.group_timing, config.timeouts, config.leases, config.store]
    for view in views:
        for field in dataclasses.fields(view):
            assert getattr(view, field.name) == getattr(config, field.name), field.name
        assert "hunter2" not in repr(view)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(view, dataclasses.fields(view)[0].name, None)
    assert config.group_timing.heartbeat == 4.0
    assert config.group_timing.rebalance_timeout == config.rebalance_timeout
    assert config.leases.redis_url == "redis://:hunter2@redis:6379/0"


class _Job(ReportJob):
    topic = "t"

    async def run(self, ctx: JobContext) -> object:
        return None


def test_job_lease_settings_are_resolved_with_the_default_renewal_interval() -> None:
    """renewal_interval defaults to lease_duration / 3."""
    timing = _Job.lease_timing(DeadlinePolicy())
    assert timing.renewal_interval == pytest.approx(_Job.lease_duration / 3)


@pytest.mark.parametrize(
    "settings",
    [{"topic": ""}, {"lease_duration": 0.5, "renewal_interval": 0.45}, {"max_runtime": -1}],
)
def test_job_settings_that_cannot_keep_the_lease_are_config_errors(
    settings: dict[str, object],
) -> None:
    """A job class with an impossible lease is rejected before it touches Redis or Kafka."""
    job_class: type[_Job] = type("Bad", (_Job,), settings)
    with pytest.raises(ConfigError):
        job_class.lease_timing(DeadlinePolicy())


@pytest.mark.parametrize(
    "job",
    ["SyncRun", "TextLease", "ZeroLossBudget", "FloatResultBound", "SlowRenewal", "NoTopic"],
)
def test_a_worker_refuses_a_job_class_that_cannot_run(job: str) -> None:
    """``Pod(...)`` checks the job class as ``leaseworker run`` does: ConfigError, at once."""
    job_class: type[ReportJob] = getattr(bad_jobs, job)
    with pytest.raises(ConfigError, match=job):
        Pod(job_class(), PodConfig())


def test_busy_backoff_grows_is_capped_jittered_and_honours_the_holders_ttl() -> None:
    """Delays double up to the cap, never exceed it, vary with jitter, and follow the hint."""
    policy = Backoff(initial=0.25, cap=2.0, jitter=0.5, rng=random.Random(7))
    delays = [policy.delay(n) for n in range(10)]
    assert all(0.125 <= d <= 2.0 for d in delays)
    assert max(delays[5:]) > 1.0  # reached the cap region
    assert len(set(delays)) == len(delays)  # jittered
    assert policy.delay(9, hint=0.4) <= 0.4  # the holder's lease ends soon: retry then
    with pytest.raises(ConfigError):
        Backoff(initial=1, cap=0.5)


@pytest.mark.parametrize("pipelining", [True, False])
async def test_lease_pipelining_reaches_the_workers_redis_leases(pipelining: bool) -> None:
    """``lease_pipelining`` decides how the worker's own lease store sends calls (no I/O)."""
    config = PodConfig(lease_pipelining=pipelining, store_url="memory://")
    worker = Pod(_Job(), config)
    leases = worker._leases  # the store the worker built for itself
    assert isinstance(leases, RedisLeases)
    assert leases.pipelining is pipelining

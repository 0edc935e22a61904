"""Every renamed public name still works and warns (docs/design.md#vocabulary).

Each old spelling gives the same object or value as the new one and raises a
``DeprecationWarning`` pointing at the caller's line; giving both spellings is
a ``TypeError`` rather than a silent choice.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import leaseworker
from leaseworker import Backoff, JobContext, LeaseTiming, ReportJob, hold
from leaseworker._cli import main
from leaseworker.testing import MemoryLeases


@pytest.mark.parametrize(
    ("old", "new"), [("Worker", "Pod"), ("WorkerConfig", "PodConfig"), ("BusyPolicy", "Backoff")]
)
def test_renamed_classes_are_the_new_ones_and_warn(old: str, new: str) -> None:
    """``leaseworker.Worker`` is ``leaseworker.Pod``, unlisted, with a warning."""
    match = f"leaseworker.{old} is deprecated; use leaseworker.{new}"
    with pytest.warns(DeprecationWarning, match=match):
        assert getattr(leaseworker, old) is getattr(leaseworker, new)
    assert old not in leaseworker.__all__
    assert old not in dir(leaseworker)


async def test_hold_takes_ttl_and_renew_every_with_a_warning() -> None:
    """``hold(ttl=, renew_every=)`` holds as the new keywords would; both at once is refused."""
    leases = MemoryLeases()
    with pytest.warns(DeprecationWarning, match="is deprecated; use") as caught:
        held = hold(leases, "k", ttl=3.0, renew_every=0.5)
    assert [str(w.message) for w in caught] == [
        "hold(): ttl= is deprecated; use lease_duration=",
        "hold(): renew_every= is deprecated; use renewal_interval=",
    ]
    assert [w.filename for w in caught] == [__file__, __file__]
    async with held:
        assert held.lease.lease_duration == 3.0
        with pytest.warns(DeprecationWarning, match="Lease.ttl is deprecated"):
            assert held.lease.ttl == 3.0
    with pytest.raises(TypeError, match="lease_duration= only"):
        hold(leases, "k", ttl=3.0, lease_duration=3.0)
    with pytest.raises(TypeError, match="missing required keyword argument: 'lease_duration'"):
        hold(leases, "k")


async def test_memory_leases_take_ttl_with_a_warning() -> None:
    """``acquire(key, ttl=)`` and ``take(key, ttl=)`` still set the lease duration."""
    leases = MemoryLeases()
    with pytest.warns(DeprecationWarning, match=r"MemoryLeases.acquire\(\): ttl=") as caught:
        lease = await leases.acquire("k", ttl=2.0)
    assert caught[0].filename == __file__
    assert lease is not None
    assert lease.lease_duration == 2.0
    with pytest.warns(DeprecationWarning, match=r"MemoryLeases.take\(\): ttl="):
        assert leases.take("k", ttl=4.0).lease_duration == 4.0
    with pytest.raises(TypeError, match="missing required argument: 'lease_duration'"):
        await leases.acquire("k")


def test_lease_timing_keeps_its_old_attribute_names() -> None:
    """``LeaseTiming.ttl`` and ``.renew_every`` read the renamed fields."""
    timing = LeaseTiming(lease_duration=30.0, renewal_interval=10.0, max_runtime=None)
    with pytest.warns(DeprecationWarning, match="LeaseTiming.ttl is deprecated"):
        assert timing.ttl == 30.0
    with pytest.warns(DeprecationWarning, match="LeaseTiming.renew_every is deprecated"):
        assert timing.renew_every == 10.0


def test_a_job_setting_busy_policy_gets_it_as_busy_backoff() -> None:
    """A subclass written with ``busy_policy`` backs off with it, warned at its class line."""
    backoff = Backoff(initial=0.5, cap=10)
    match = "OldJob.busy_policy is deprecated; use busy_backoff"
    with pytest.warns(DeprecationWarning, match=match) as caught:

        class OldJob(ReportJob):
            topic = "t"
            busy_policy = backoff

            async def run(self, ctx: JobContext) -> object:
                return None

    assert OldJob.busy_backoff is backoff
    assert caught[0].filename == __file__


def test_demo_ttl_flag_is_read_as_lease_duration(capsys: pytest.CaptureFixture[str]) -> None:
    """``--ttl`` still sets the incident's lease (one below the minimum: exit 2, no services)."""
    assert main(["demo", "incident", "--ttl", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--ttl is deprecated; use --lease-duration" in err
    assert "--lease-duration must be at least" in err


@pytest.mark.parametrize(
    "command",
    [["run", "tests.jobs:MarkerJob"], ["trigger", "reports.requested"], ["topics", "create", "t"]],
    ids=["run", "trigger", "topics"],
)
def test_kafka_ssl_cafile_is_read_as_kafka_ca_file_with_one_warning(
    command: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The CA's flag of a release ago reaches the Kafka settings (a missing file: exit 2)."""
    missing = tmp_path / "ca.pem"
    argv = [*command, "--bootstrap-servers", "127.0.0.1:1", "--kafka-security-protocol", "SSL"]
    said = "--kafka-ssl-cafile is deprecated; use --kafka-ca-file"
    with pytest.warns(DeprecationWarning, match=said) as caught:
        assert main([*argv, "--kafka-ssl-cafile", str(missing)]) == 2
    assert [str(w.message) for w in caught] == [said]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [said]
    assert f"Kafka CA file not found: {missing}" in capsys.readouterr().err
    assert main([*argv, "--kafka-ssl-cafile", str(missing), "--kafka-ca-file", "other"]) == 2
    assert "give --kafka-ca-file only" in capsys.readouterr().err


def test_the_kafka_cas_old_variable_is_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``LEASEWORKER_KAFKA_SSL_CAFILE`` sets the CA when ``LEASEWORKER_KAFKA_CA_FILE`` is unset."""
    missing = tmp_path / "ca.pem"
    monkeypatch.delenv("LEASEWORKER_KAFKA_CA_FILE", raising=False)
    monkeypatch.setenv("LEASEWORKER_KAFKA_SSL_CAFILE", str(missing))
    argv = ["topics", "create", "t", "--bootstrap-servers", "127.0.0.1:1"]
    assert main([*argv, "--kafka-security-protocol", "SSL"]) == 2
    assert f"Kafka CA file not found: {missing}" in capsys.readouterr().err

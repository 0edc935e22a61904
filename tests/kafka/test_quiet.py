"""Folding aiokafka's repeated log lines (``_kafka._quiet.FoldRepeats``), on a fake clock."""

from __future__ import annotations

import logging

import aiokafka  # type: ignore[import-untyped]
import pytest

from leaseworker._kafka import _quiet
from leaseworker._kafka._quiet import FOLD, FoldRepeats, fold_aiokafka_logs


def _record(msg: str, level: int = logging.ERROR, name: str = "aiokafka") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, ("x",), None)


def test_the_first_of_a_kind_passes_and_its_repeats_are_counted_into_the_next_window() -> None:
    """Within the window only the first record of a kind passes; the next one says how many."""
    now = [0.0]
    fold = FoldRepeats(window=30, clock=lambda: now[0])
    assert fold.filter(_record("Unable connect to node %s"))
    assert [fold.filter(_record("Unable connect to node %s")) for _ in range(500)] == [False] * 500
    assert fold.filter(_record("Unable to update metadata from %s"))  # another kind
    assert fold.filter(_record("Unable connect to node %s", name="aiokafka.conn"))  # another logger
    now[0] = 30.0
    record = _record("Unable connect to node %s")
    assert fold.filter(record)
    assert record.getMessage() == "Unable connect to node x (500 more like it in the last 30s)"
    assert not fold.filter(_record("Unable connect to node %s"))


def test_records_below_warning_always_pass() -> None:
    """INFO and DEBUG lines (a coordinator found, a rebalance) are never held back."""
    fold = FoldRepeats(window=30, clock=lambda: 0.0)
    assert all(fold.filter(_record("Discovered coordinator %s", logging.INFO)) for _ in range(5))


@pytest.mark.parametrize("name", ["aiokafka", "aiokafka.consumer.fetcher", "aiokafka.conn"])
def test_every_aiokafka_logger_gets_the_filter_once(name: str) -> None:
    """Logger filters do not apply to children's records: each module's logger has its own."""
    import aiokafka.consumer  # type: ignore[import-untyped]  # noqa: F401

    fold_aiokafka_logs()
    fold_aiokafka_logs()
    assert logging.getLogger(name).filters.count(FOLD) == 1


class _Client:
    """Stands in for an ``AIOKafkaClient``: only the method the patch wraps."""

    async def _metadata_update(self) -> bool:
        return True


@pytest.mark.parametrize("version", ["0.13.0", "0.15.0", "1.0.0", "0.x", "unknown"])
def test_the_metadata_patch_stands_down_with_one_warning_outside_its_releases(
    version: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On an aiokafka the private patch was not read from, clients stay unpatched.

    One WARNING names the version, however many clients are built.
    """
    monkeypatch.setattr(aiokafka, "__version__", version)
    monkeypatch.setattr(_quiet, "_STOOD_DOWN", set())
    clients = [_Client(), _Client()]
    with caplog.at_level(logging.WARNING, logger="leaseworker.kafka"):
        for client in clients:
            _quiet.quiet(client)
    assert not [c for c in clients if getattr(c._metadata_update, "_leaseworker_backoff", False)]
    assert [r.getMessage() for r in caplog.records if version in r.getMessage()] == [
        f"aiokafka {version} is not the 0.14 release leaseworker's metadata backoff was read "
        "from: running without it (a broker outage may log and poll more)"
    ]


@pytest.mark.parametrize("version", ["0.14.0", "0.14.3", "0.14.0rc1"])
def test_the_metadata_patch_applies_on_the_release_it_was_read_from(
    version: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On aiokafka 0.14.x the client's metadata update is wrapped, with no warning."""
    monkeypatch.setattr(aiokafka, "__version__", version)
    client = _Client()
    with caplog.at_level(logging.WARNING, logger="leaseworker.kafka"):
        _quiet.quiet(client)
    assert getattr(client._metadata_update, "_leaseworker_backoff", False)
    assert not [r for r in caplog.records if "metadata backoff" in r.getMessage()]

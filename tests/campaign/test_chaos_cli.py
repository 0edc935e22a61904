"""``leaseworker chaos`` refuses what it cannot run, at once, with exit 2 and one line."""

from __future__ import annotations

import pytest

from leaseworker._cli import main


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["no_such_module:Job"], "cannot import 'no_such_module'"),
        (["tests.jobs:MarkerJob", "--payloads", "nocolon"], "pkg.module:function"),
        (
            ["tests.jobs:MarkerJob", "--kafka-brokers", "3", "--bootstrap-servers", "h:9092"],
            "--kafka-brokers is for local brokers",
        ),
        (
            ["tests.jobs:MarkerJob", "--postgres-standby", "sync", "--store-url", "sqlite:///x"],
            "--postgres-standby starts its own store",
        ),
        (
            ["tests.jobs:MarkerJob", "--postgres-standby", "async", "--hosts"],
            "--postgres-standby starts its own store",
        ),
    ],
)
def test_what_the_campaign_cannot_run_exits_2(
    argv: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing is started: the reason is the last line on stderr."""
    assert main(["chaos", *argv]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("leaseworker chaos: error: ")
    assert reason in last

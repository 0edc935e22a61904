"""A CPU-bound job that never awaits, on two real pods with a 3 s lease, its holder's Redis cut.

Through ``run_in_process`` its child is dead (the kernel's exit time) before
the holder's local deadline and before the other pod takes the key: no
overlap. The same loop in the event loop runs on after the other pod took the
key. ``bench/process_takeover.py`` runs the fifty-trial version.
"""

from __future__ import annotations

from pathlib import Path

from leaseworker_dev._campaign import takeover_trials
from leaseworker_dev._services import LocalKafka, LocalRedis

from .cli import CAMPAIGNS


@CAMPAIGNS
async def test_run_in_process_is_killed_before_the_deadline_and_the_event_loop_overlaps(
    kafka_server: LocalKafka, redis_server: LocalRedis, tmp_path: Path
) -> None:
    """Two trials through run_in_process: no overlap, the child dead in time; the loop overlaps."""
    trials = await takeover_trials(
        bootstrap=kafka_server.bootstrap_servers,
        redis_port=redis_server.port,
        workdir=tmp_path,
        plan=["process", "process", "loop"],
    )
    *in_child, in_loop = trials
    for trial in in_child:
        assert trial.exited is not None  # the kernel's word, not a log line
        assert trial.lost is not None
        assert trial.lost <= trial.exited
        assert trial.deadline_margin is not None
        assert trial.deadline_margin > 0, trial.line()  # dead before the local deadline
        assert trial.overlap == 0, trial.line()
        assert trial.ran_until < trial.taken
    assert in_loop.exited is None
    assert in_loop.overlap > 1.0, in_loop.line()  # it computed on while the other pod held the key
    assert in_loop.margin is not None
    assert in_loop.margin < 0  # after its key could expire

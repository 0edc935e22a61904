"""The pods' stall wrapper plays a stall request once, where it was asked, and records it."""

from __future__ import annotations

from pathlib import Path

from leaseworker.toolkit import History, header_line
from leaseworker_dev._campaign._stall import maybe_stall, stall_log, stall_request


def test_a_stall_request_is_played_once_at_its_place_and_recorded(tmp_path: Path) -> None:
    """A request for a job's end is left alone at a start, taken at an end, and logged."""
    stall_request(tmp_path, "pod-1").write_text("0.01 end")
    maybe_stall(tmp_path, "pod-1", "start")
    assert stall_request(tmp_path, "pod-1").exists()
    maybe_stall(tmp_path, "pod-1", "end")
    assert not stall_request(tmp_path, "pod-1").exists()
    maybe_stall(tmp_path, "pod-1", "end")  # nothing left to play
    text = header_line("monotonic") + stall_log(tmp_path, "pod-1").read_text()
    (fault,) = History.from_json(text).faults
    assert (fault.kind, fault.target, fault.attrs["at"]) == ("loop_stall", "pod-1", "end")
    assert fault.end is not None
    assert fault.end - fault.start >= 0.01
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pod-1.stalls.jsonl"]

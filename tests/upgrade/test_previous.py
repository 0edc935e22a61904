"""Building the previous release: which one it is, and a commit the clone lacks."""

from __future__ import annotations

import pytest

from leaseworker import __version__

from .previous import build, previous_release


def test_the_previous_release_is_the_newest_recorded_below_this_version() -> None:
    """While this code is 0.2.0.dev0, 0.1.0 at the commit the lead tagged v0.1.0."""
    version, commit = previous_release()
    if __version__ == "0.2.0.dev0":
        assert (version, commit[:7]) == ("0.1.0", "1178e00")
    assert len(commit) == 40


def test_a_commit_missing_from_the_clone_fails_in_one_line_without_building() -> None:
    """A shallow clone lacks the release's commit: one line says so and what to do."""
    missing = "0" * 40
    with pytest.raises(LookupError) as failed:
        build("0.0.1", missing)
    message = str(failed.value)
    assert "\n" not in message
    assert message == (
        "release 0.0.1's commit 000000000000 is not in this clone's history"
        " (a shallow clone? git fetch --unshallow)"
    )

"""``--dist loadgroup`` for this suite: the groups reach pytest-xdist's scheduler by a file.

pytest-xdist 3.8 groups a test by appending ``@group`` to ``item._nodeid`` in the
worker; pytest 9.2 derives ``nodeid`` from ``item._id`` instead, so the scheduler
never sees a group and spreads every test (the container tests built the image
in two workers at once, each removing the other's). Here each worker writes the
groups it gave (node id to group, the same in every worker: they collect the same
tests) to a file of the run's, and the controller's scheduler reads them when it
splits the tests into work units, after every worker has collected.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

KEY = "leaseworker_groups"
"""The ``workerinput`` entry naming the directory the workers write their groups to."""


def write(config: pytest.Config, groups: dict[str, str]) -> None:
    """In a worker: record ``groups`` (node id to group) for the controller."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or KEY not in workerinput:
        return
    path = Path(workerinput[KEY], f"{workerinput['workerid']}.json")
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(groups))
    os.replace(partial, path)  # the controller never reads half a file


class StackGroups(LoadGroupScheduling):  # type: ignore[misc]
    """xdist's loadgroup scheduling, its groups read from the workers' files."""

    def __init__(self, config: pytest.Config, log: Any, directory: Path) -> None:
        super().__init__(config, log)
        self.directory = directory
        self.groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.groups is None:  # first called once every worker finished collecting
            found = sorted(self.directory.glob("*.json"))
            self.groups = json.loads(found[0].read_text()) if found else {}
        group = self.groups.get(nodeid)
        return f"group:{group}" if group is not None else str(super()._split_scope(nodeid))

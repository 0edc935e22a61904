"""The releases: one version for both distributions, each release's commit, its table row.

``releases.toml`` names each released version's commit (a clone may lack
tags); the CHANGELOG has a section per release under an ``Unreleased`` one;
:data:`leaseworker._version.RELEASES` says what each release writes and which
releases it runs beside, and its last row is the code here.
"""

from __future__ import annotations

import itertools
import re
import tomllib

from leaseworker import __version__
from leaseworker._store import MIGRATIONS
from leaseworker._version import RELEASES, runs_beside_schema

from .pods import REPO

RECORDED: dict[str, str] = tomllib.loads((REPO / "releases.toml").read_text(encoding="utf-8"))[
    "releases"
]
SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def _key(version: str) -> tuple[int, ...]:
    match = SEMVER.match(version)
    assert match is not None, f"{version} is not MAJOR.MINOR.PATCH"
    return tuple(int(part) for part in match.groups())


def test_the_version_is_the_next_release_in_development_or_the_one_being_cut() -> None:
    """``0.2.0.dev0`` between releases, ``0.2.0`` on the commit that cuts it (recorded after)."""
    base, marker, dev = __version__.partition(".dev")
    assert RELEASES[-1].version == base
    assert not marker or dev.isdigit()
    assert all(_key(version) <= _key(base) for version in RECORDED)
    if marker:
        assert base not in RECORDED, f"{base} is released: bump to the next .dev0"


def test_every_recorded_release_has_a_full_commit_a_row_and_a_changelog_section() -> None:
    """A 40-digit sha each; the CHANGELOG opens with Unreleased, then the releases newest first."""
    assert list(RECORDED) == sorted(RECORDED, key=_key)
    assert all(re.fullmatch(r"[0-9a-f]{40}", sha) for sha in RECORDED.values())
    assert set(RECORDED) <= {release.version for release in RELEASES}
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (\S+)", changelog, flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert headings[1 : 1 + len(RECORDED)] == sorted(RECORDED, key=_key, reverse=True)


def test_the_tools_carry_and_require_exactly_the_library_version() -> None:
    """tools/pyproject.toml reads the library's version file and pins the library to it."""
    tools = tomllib.loads((REPO / "tools" / "pyproject.toml").read_text(encoding="utf-8"))
    assert tools["tool"]["hatch"]["version"]["path"] == "../src/leaseworker/_version.py"
    assert f"leaseworker=={__version__}" in tools["project"]["dependencies"]


def test_the_table_matches_the_schema_and_a_raised_runs_beside_brings_a_migration() -> None:
    """The last row's schema is the newest migration; each runs_beside is an earlier release.

    A release that runs beside fewer releases than the one before it must
    bring a migration: the store's mark of it is how pods of older releases
    learn, at start, that they may not run beside it.
    """
    assert RELEASES[-1].schema == MIGRATIONS[-1].version
    versions = [release.version for release in RELEASES]
    assert versions == sorted(versions, key=_key)
    for before, after in itertools.pairwise(RELEASES):
        assert _key(after.runs_beside) <= _key(after.version)
        assert after.schema >= before.schema
        if _key(after.runs_beside) > _key(before.runs_beside):
            assert after.schema > before.schema, f"{after.version} raises runs_beside"
        if _key(after.runs_beside) <= _key(before.version):
            assert (after.fence_keys, after.effect_headers) == (
                before.fence_keys,
                before.effect_headers,
            ), f"{after.version} writes formats {before.version} cannot read"
    assert runs_beside_schema() <= RELEASES[-1].schema

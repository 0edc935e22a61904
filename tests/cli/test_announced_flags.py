"""Every flag CHANGELOG.md ever announced still parses, so none disappears without an alias.

The flags are read from CHANGELOG.md at test time (``--word-word`` spellings);
each must be recognised by the parser of at least one ``leaseworker`` command
(the tools' ``demo`` and ``chaos`` included), or be a bench script's. A flag
renamed on purpose is listed in :data:`RENAMED` with its replacement: the old
spelling stays, hidden from ``--help``, on every command that has the new one.
One retired for good goes in :data:`RETIRED`, with what replaces it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from leaseworker._cli._main import build_parser

from ..pods import REPO

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w*-])")
"""A flag as CHANGELOG.md spells it (``--kafka-*``, a family, is none)."""

RENAMED = {
    "--ttl": "--lease-duration",  # demo incident, issue 26
    "--kafka-ssl-cafile": "--kafka-ca-file",  # run, trigger, topics create, chaos; issue 30
}
"""Old spelling -> new one; the old still parses (a deprecated alias that warns)."""

RETIRED: dict[str, str] = {}
"""Old spelling -> new one, for a flag deliberately no longer accepted (none so far)."""

BENCH = {
    "--parts": "bench/effects.py",
    "--sdk-batch": "bench/telemetry_overhead.py",
    "--topology": "bench/lease_ops.py",
}
"""Flags the CHANGELOG announced for a bench script rather than a command."""


def announced() -> list[str]:
    """Every flag CHANGELOG.md names, in first-mention order."""
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    return list(dict.fromkeys(FLAG.findall(text)))


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Yield ``("leaseworker topics create", parser)`` for the top level and every subcommand."""
    yield " ".join(("leaseworker", *path)), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def accepting() -> dict[str, set[str]]:
    """Each flag any command recognises, with the commands that do."""
    found: dict[str, set[str]] = {}
    for name, parser in commands(build_parser()):
        for flag in parser._option_string_actions:
            found.setdefault(flag, set()).add(name)
    return found


def test_the_changelog_names_flags_and_the_lists_name_announced_ones() -> None:
    """The extraction finds what it must; every listed flag is one the changelog announced."""
    flags = announced()
    assert {"--grant-to", "--kafka-ca-file", "--ttl", "--lease-duration", "--from"} <= set(flags)
    assert "--kafka" not in flags  # `--kafka-*` names a family
    assert {*RENAMED, *RETIRED, *BENCH} <= set(flags)
    assert not set(RENAMED) & set(RETIRED)


@pytest.mark.parametrize("flag", announced())
def test_each_announced_flag_parses_somewhere(flag: str) -> None:
    """A command recognises it, or a bench script defines it, or it was retired on purpose."""
    found = accepting()
    if flag in RETIRED:
        assert flag not in found, f"{flag} is listed as retired but still parses"
        assert RETIRED[flag] in found, f"{flag}'s replacement {RETIRED[flag]} does not parse"
    elif flag in BENCH:
        assert f'"{flag}"' in (REPO / BENCH[flag]).read_text(encoding="utf-8")
    else:
        assert flag in found, (
            f"{flag} was announced in CHANGELOG.md but no command accepts it: keep it as a "
            "deprecated alias (RENAMED) or list it as RETIRED with its replacement"
        )


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_a_renamed_flag_parses_wherever_its_replacement_does_and_is_hidden(
    old: str, new: str
) -> None:
    """Every command with the new spelling accepts the old one; only the new is in ``--help``."""
    found = accepting()
    assert new in found
    assert found[new] <= found.get(old, set()), f"{old} missing from {found[new] - found[old]}"
    for name, parser in commands(build_parser()):
        if name in found[old]:
            assert parser._option_string_actions[old].help == argparse.SUPPRESS, (name, old)
            assert old not in parser.format_help(), (name, old)

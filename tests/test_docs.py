"""The docs hold together: every link between them resolves, and they stay within their budget.

Links are checked as GitHub renders them: a relative link must name a file of
the repository, and its ``#anchor`` a heading of that file (GitHub's slug:
lower case, punctuation dropped, spaces to hyphens, ``-1`` for a repeat).
Source docstrings that send the reader to ``docs/<page>.md#<anchor>`` are held
to the same rule, so renaming a heading cannot strand them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [
    REPO / "README.md",
    REPO / "CHANGELOG.md",
    REPO / "bench" / "README.md",
    *DOCS,
    *sorted((REPO / "examples").rglob("*.md")),
]
DOCS_WORD_LIMIT = 15_000
README_CHAR_LIMIT = 12_000

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SOURCE_REFERENCE = re.compile(r"docs/([a-z_]+\.md)#([A-Za-z0-9_-]+)")


def _prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for the headings of ``path``."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(path.read_text()):
        match = HEADING.match(line)
        if match is None:
            continue
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_the_slug_is_githubs() -> None:
    """Headings with code, punctuation and repeats get the anchors GitHub gives them."""
    assert _slug("Try it: `leaseworker demo`") == "try-it-leaseworker-demo"
    assert _slug("Health and readiness (`--health-port`)") == "health-and-readiness---health-port"
    assert _slug("OTLP/JSON export") == "otlpjson-export"
    assert _slug("Telemetry overhead (`bench/telemetry_overhead.py`)") == (
        "telemetry-overhead-benchtelemetry_overheadpy"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page: Path) -> None:
    """Each relative link names an existing file and, for a page, one of its headings."""
    broken = []
    for line in _prose_lines(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            if not resolved.exists():
                broken.append(f"{target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_source_references_to_the_docs_resolve() -> None:
    """``docs/<page>.md#<anchor>`` in the code and tests names an existing heading."""
    broken = []
    for root in ("src", "tests", "examples", "scripts", "bench"):
        for source in (REPO / root).rglob("*"):
            if source.suffix not in {".py", ".md", ".sh", ".toml"} or not source.is_file():
                continue
            for page, anchor in SOURCE_REFERENCE.findall(source.read_text()):
                target = REPO / "docs" / page
                if not target.exists() or anchor not in anchors(target):
                    broken.append(f"{source.relative_to(REPO)}: docs/{page}#{anchor}")
    assert not broken, "; ".join(broken)


def test_docs_and_readme_stay_within_their_budget() -> None:
    """docs/ is at most 15,000 words and README 12,000 characters, as `wc -w` and `wc -c` count."""
    words = sum(len(page.read_text().split()) for page in DOCS)
    assert words <= DOCS_WORD_LIMIT, f"docs/ has {words} words"
    characters = len((REPO / "README.md").read_bytes())
    assert characters <= README_CHAR_LIMIT, f"README.md has {characters} characters"

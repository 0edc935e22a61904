"""No run of ten identical lines stands twice in ``src/`` (issue 26's done-when).

A copied block is the cheapest duplication to make and the easiest to let
drift, so it is checked on every run rather than by an optional tool. Lines
are compared stripped of indentation (a block moved into a function is still
a copy); blank lines and lines of only brackets, quotes and commas are left
out, since formatting makes those everywhere and they would let seven real
lines plus three closers count as ten. Comments and docstrings count: a
copied explanation drifts like copied code.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
RUN = 10
_FILLER = re.compile(r"""^[\s()\[\]{}"',:;]*$""")


def repeats(root: Path, run: int = RUN) -> list[str]:
    """Return ``file:line ~ file:line`` for each run of ``run`` identical lines seen twice."""
    seen: dict[tuple[str, ...], list[tuple[str, int, int]]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        kept = [
            (number, text.strip())
            for number, text in enumerate(path.read_text().splitlines(), start=1)
            if not _FILLER.match(text)
        ]
        name = str(path.relative_to(root))
        for start in range(len(kept) - run + 1):
            window = tuple(text for _, text in kept[start : start + run])
            seen[window].append((name, start, kept[start][0]))
    found = []
    for places in seen.values():
        first_name, first_index, first_line = places[0]
        for name, index, line in places[1:]:
            if name != first_name or index - first_index >= run:  # not the same run, shifted
                found.append(f"{first_name}:{first_line} ~ {name}:{line}")
                break
    return found


def test_no_run_of_ten_identical_lines_stands_twice_in_src() -> None:
    """Factor a repeated block into one function or constant instead of copying it."""
    found = repeats(SRC)
    assert not found, "repeated runs of ten lines: " + "; ".join(found[:10])


def test_a_planted_copy_is_found(tmp_path: Path) -> None:
    """The check itself: a ten-line block pasted into a second file (re-indented) fails it."""
    block = [f"value_{i} = compute({i}, seed)" for i in range(RUN)]
    (tmp_path / "a.py").write_text("\n".join(["import x", *block, ""]))
    pasted = ["def f():", *(f"    {line}" for line in block[:5]), "", "    )"]
    pasted += [f"    {line}" for line in block[5:]]
    (tmp_path / "b.py").write_text("\n".join(pasted))
    assert repeats(tmp_path) == ["a.py:2 ~ b.py:2"]
    (tmp_path / "b.py").write_text("\n".join(pasted[:-1]))  # nine lines: allowed
    assert repeats(tmp_path) == []

#!/usr/bin/env bash
# The whole test suite: bootstrap, lint, type-check, then pytest against real services
# that the suite starts itself on free loopback ports. Extra args go to pytest.
# The run ends with its 25 slowest tests and the wall time per test directory
# (leaseworker_dev._suite_report), in CI's log too.
#
# Tests run in parallel: WORKERS pytest-xdist workers (default 4; on two cores 3 took
# 9.5 min, 4 about 8, 5 hardly less: the two cores are the limit, and the tests' own time
# grew from 1,920 s to 2,330 s), each with services of its own, --dist loadgroup keeping
# the tests of one heavy stack (and the campaigns) in one worker, in turn, those groups
# first (tests/conftest.py).
# `-n 0` runs them in this process, one after another; a later -n or --dist wins.
# SUITE_BOUND=S (seconds; .ci/run sets it) fails the run when pytest took longer.
#
#   bash scripts/test.sh --repeat N PATTERN [pytest args]
# proves a fix: bootstrap, then N runs of the tests PATTERN names, in one pytest session
# (pytest-repeat's --count N --repeat-scope session: every test once, then all again), no
# lint, type check or coverage; it ends with "repeat: K of N runs passed". PATTERN is a
# path or node id when it names an existing file or directory (tests/lease/test_hold.py,
# tests/lease/test_hold.py::test_x), else a -k expression ("hold and not virtual").
set -euo pipefail
cd "$(dirname "$0")/.."
# Python writes its bytecode (and pytest its rewritten test modules) next to the sources,
# even where PYTHONDONTWRITEBYTECODE is set: the suite starts some 640 Python processes
# (pods and CLI runs) and 4 xdist workers, and each would compile the checkout from source
# again: 0.12 s of CPU per pod start, 3.4 s per worker's collection.
unset PYTHONDONTWRITEBYTECODE
parallel=(-n "${WORKERS:-4}" --dist loadgroup)
if [ "${1:-}" = "--repeat" ]; then
    count="${2:-}" pattern="${3:-}"
    if ! [[ "$count" =~ ^[1-9][0-9]*$ ]] || [ -z "$pattern" ]; then
        echo "usage: bash scripts/test.sh --repeat N PATTERN [pytest args] (N a positive count)" >&2
        exit 2
    fi
    shift 3
    bash scripts/bootstrap.sh
    selection=(-k "$pattern")
    [ -e "${pattern%%::*}" ] && selection=("$pattern")
    echo "== pytest, $count runs of ${selection[*]}"
    exec .venv/bin/pytest "${parallel[@]}" --count "$count" --repeat-scope session \
        --durations=10 "${selection[@]}" "$@"
fi
bash scripts/bootstrap.sh
echo "== ruff"; .venv/bin/ruff check src tools/src tests bench
.venv/bin/ruff format --check src tools/src tests bench
echo "== mypy --strict"; .venv/bin/mypy
echo "== import contracts"; .venv/bin/lint-imports --no-cache
echo "== pytest"
started=$SECONDS
.venv/bin/pytest "${parallel[@]}" --cov --cov-report=term-missing:skip-covered --durations=25 "$@"
took=$((SECONDS - started))
echo "== pytest took $((took / 60)) min $((took % 60)) s (bound: ${SUITE_BOUND:-none} s)"
if [ -n "${SUITE_BOUND:-}" ] && [ "$took" -gt "$SUITE_BOUND" ]; then
    echo "the suite ran $took s, past its bound of $SUITE_BOUND s: see the slowest tests above" >&2
    exit 1
fi

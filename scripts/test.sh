#!/usr/bin/env bash
# The whole test suite: bootstrap, lint, type-check, then pytest against real services
# that the suite starts itself on free loopback ports. Extra args go to pytest.
# The run ends with its 25 slowest tests and the wall time per test directory
# (leaseworker_dev._suite_report), in CI's log too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
echo "== ruff"; .venv/bin/ruff check src tools/src tests bench
.venv/bin/ruff format --check src tools/src tests bench
echo "== mypy --strict"; .venv/bin/mypy
echo "== import contracts"; .venv/bin/lint-imports --no-cache
echo "== pytest"; .venv/bin/pytest --cov --cov-report=term-missing:skip-covered --durations=25 "$@"

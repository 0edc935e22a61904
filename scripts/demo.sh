#!/usr/bin/env bash
# The main job on the embedded local default: install what is missing, then run
# the demo against private services started on free loopback ports (and stopped
# afterwards). Extra args go to `leaseworker demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/leaseworker demo "$@"

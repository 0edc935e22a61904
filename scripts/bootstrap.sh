#!/usr/bin/env bash
# Install everything leaseworker's demo and tests need; safe to run again.
#  - Debian packages: redis-server, postgresql, chromium, podman, runc, debootstrap
#    (only when missing; needs root or sudo)
#  - a virtualenv in .venv with leaseworker and its tools (leaseworker-dev, tools/)
#    installed editable, plus dev tools
#  - Kafka jars (Maven) and the Jaeger binary (Go) into ~/.cache/leaseworker
#    (override with LEASEWORKER_CACHE), outside the clone; skipped when cached.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
# Headless Chromium renders the timeline page in its test (Debian's package; no download).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Container tests (tests/deploy): Podman run with runc (crun's setrlimit is refused on
# these machines) and debootstrap, which makes the local base image (no registry here).
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
# The clock-step shim (deploy/local/clockshift) is built with the C compiler.
command -v cc >/dev/null 2>&1 || need+=(gcc)
if ((${#need[@]})); then
    echo "bootstrap: installing Debian packages: ${need[*]}"
    sudo_=""
    [ "$(id -u)" -eq 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Debian starts the packaged services; leaseworker runs its own private ones.
for svc in redis-server postgresql; do
    if command -v service >/dev/null 2>&1 && service "$svc" status >/dev/null 2>&1; then
        service "$svc" stop >/dev/null 2>&1 || true
    fi
done

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv with $PY"
    "$PY" -m venv .venv
fi
stamp=.venv/.leaseworker-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ tools/pyproject.toml -nt "$stamp" ] \
    || [ constraints.txt -nt "$stamp" ]; then
    echo "bootstrap: installing leaseworker, leaseworker-dev and dev tools into .venv (versions: constraints.txt)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]' -e ./tools
    touch "$stamp"
fi

# Service binaries: fetched/built once, then reused from the cache.
.venv/bin/python -m leaseworker_dev._services.prepare

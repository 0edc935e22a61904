"""Fetch and build every local service binary once.

Run as ``python -m leaseworker_dev._services.prepare`` (``scripts/bootstrap.sh``
does), so the first test run or demo does not pay for the Kafka download or the
Jaeger build. Redis and PostgreSQL come from Debian packages.
"""

from __future__ import annotations

import time

from ._kafka import LocalKafka
from ._local_jaeger import LocalJaeger


def main() -> None:
    """Ensure the Kafka jars and the Jaeger binary are in the cache."""
    for name, ensure in (
        ("kafka", LocalKafka.ensure_installed),
        ("jaeger", LocalJaeger.ensure_built),
    ):
        started = time.monotonic()
        path = ensure()
        print(f"prepare: {name} ready at {path} ({time.monotonic() - started:.1f}s)", flush=True)


if __name__ == "__main__":
    main()

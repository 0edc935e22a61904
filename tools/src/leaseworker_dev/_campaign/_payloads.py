"""Trigger payloads: the default generator, and loading the user's ``pkg.module:function``.

A generator is called as ``generate(rng, key, version)`` with the campaign's
seeded ``random.Random``, a key index and an input-version counter, and
returns ``(record key, payload dict)``. The default one suits jobs keyed by
the record key and jobs keyed by ``tenant`` and ``period`` (the example
``MonthlyReport``): both name the same job key, ``report:tenant-<key>:2026-11``,
and the payload's ``inputVersion`` carries the version.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
from collections.abc import Callable
from typing import Any

from leaseworker.toolkit import ConfigError

Generator = Callable[[random.Random, int, int], tuple[str | None, dict[str, Any]]]
"""``(rng, key index, version) -> (record key, payload)``."""


def default_payloads(rng: random.Random, key: int, version: int) -> tuple[str, dict[str, Any]]:
    """Key ``report:tenant-<key>:2026-11``; a ``rows`` count for jobs that read one."""
    tenant, period = f"tenant-{key}", "2026-11"
    payload = {
        "tenant": tenant,
        "period": period,
        "inputVersion": f"v{version}",
        "rows": rng.randrange(100_000, 500_000),
    }
    return f"report:{tenant}:{period}", payload


def load_generator(spec: str | None) -> Generator:
    """Import ``pkg.module:function`` (the current directory first on the path), or the default."""
    if spec is None:
        return default_payloads
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"--payloads must look like pkg.module:function, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    generate = getattr(module, name, None)
    if not callable(generate):
        raise ConfigError(f"{spec} is not a function")
    return generate  # type: ignore[no-any-return]

"""Helpers (no tests): probe a pod's health endpoints over HTTP; start pods that serve them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio

from leaseworker_dev._services import PodProcess

from .pods import spawn as start_pod


def get_json(url: str, *, timeout: float = 3.0) -> tuple[int, dict[str, Any]]:
    """GET ``url``; return the status code and the JSON body (also for 4xx/5xx answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return int(reply.status), json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read())


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """GET ``http://127.0.0.1:{port}{path}`` from a worker thread (the loop stays free)."""
    return await anyio.to_thread.run_sync(get_json, f"http://127.0.0.1:{port}{path}")


def spawn(name: str, job: str, workdir: Path, env: dict[str, str], *extra: str) -> PodProcess:
    """Start ``leaseworker run JOB`` as pod ``name``, logging to ``workdir/name.log``."""
    return start_pod(name, job, workdir, env, *extra, log_level="DEBUG")

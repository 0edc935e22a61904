"""Keeping a Kafka outage quiet and cheap: metadata backoff and folded aiokafka log lines.

Read from aiokafka 0.14: while a partition has no known leader (a broker
restarting), the consumer's fetcher and the producer's sender force a
metadata refresh on every pass and wait for it; the client's metadata task
answers at once when every broker refuses the connection, so the two spin,
logging "Unable connect to node" and "Unable to update metadata" each turn
(thousands of lines a second, a core busy). :func:`back_off_metadata` makes a
failed refresh wait out a capped backoff before it answers, and spaces
refreshes by at least 0.1 s, as the Java client does; :class:`FoldRepeats`
lets the first aiokafka warning or error of each kind through and counts the
repeats into the next one. :func:`quiet` applies both to a client.

The patch is of a private method, read from aiokafka 0.14
(:data:`PATCHED_RELEASES`): on any other release it stands down with one
WARNING and the client runs unpatched (the log folding, public API only,
still applies). Before widening the range, run
``tests/kafka/test_worker_kafka_outage.py``, whose spinning test says
whether the new release still spins (and needs this) or not.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, final

import aiokafka  # type: ignore[import-untyped]
import anyio

from .._backoff import Backoff
from ._log_names import logger

METADATA_BACKOFF = Backoff(initial=0.2, cap=1.0, jitter=0.2)
"""Waits after failed metadata refreshes: short, so a broker that is back is seen soon."""

MIN_REFRESH_INTERVAL = 0.1
"""Seconds between the starts of two metadata refreshes of one client (its ``retry_backoff``)."""

PATCHED_RELEASES = ((0, 14), (0, 15))
"""The aiokafka releases (major, minor; from inclusive, to exclusive) the patch was read from."""

FOLD_WINDOW = 30.0
"""Seconds during which repeats of one aiokafka message are counted instead of logged."""


def back_off_metadata(
    client: Any, policy: Backoff = METADATA_BACKOFF, *, every: float = MIN_REFRESH_INTERVAL
) -> None:
    """Make ``client`` (an ``AIOKafkaClient``) refresh metadata at most every ``every`` seconds.

    And wait out ``policy``'s backoff before answering a failed refresh (a
    success resets it). Patches the instance's ``_metadata_update``, the one
    method its metadata task and ``fetch_all_metadata`` call. A broker that
    answers while no leader is elected yet (the seconds after it starts) is
    refreshed in a loop too: ``every`` bounds that. A client already patched
    is left alone.
    """
    update = client._metadata_update
    if getattr(update, "_leaseworker_backoff", False):
        return
    failures = 0
    last = -math.inf

    @functools.wraps(update)
    async def backing_off(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures, last
        early = last + every - time.monotonic()
        if early > 0:
            await anyio.sleep(early)
        updated = await update(*args, **kwargs)
        last = time.monotonic()
        if updated:
            failures = 0
            return updated
        delay = policy.delay(failures)
        failures += 1
        await anyio.sleep(delay)
        return updated

    backing_off._leaseworker_backoff = True  # type: ignore[attr-defined]
    client._metadata_update = backing_off


def quiet(client: Any) -> None:
    """Keep an outage cheap and quiet for ``client``: metadata backoff, folded aiokafka logs.

    The pod's consumer and dead-letter producer, ``send_trigger``'s producer
    and every admin client (``_admin.started_admin``) each go through this
    once, right after they are built (``client`` is their ``AIOKafkaClient``).
    """
    if patch_fits(aiokafka.__version__):
        back_off_metadata(client)
    fold_aiokafka_logs()


_STOOD_DOWN: set[str] = set()
"""The aiokafka versions already warned about (one WARNING per process)."""


def patch_fits(version: str) -> bool:
    """Whether aiokafka ``version`` is one :data:`PATCHED_RELEASES` covers; warn once if not."""
    try:
        release = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        release = ()
    low, high = PATCHED_RELEASES
    if low <= release < high:
        return True
    if version not in _STOOD_DOWN:
        _STOOD_DOWN.add(version)
        logger.warning(
            "aiokafka %s is not the %d.%d release leaseworker's metadata backoff was read "
            "from: running without it (a broker outage may log and poll more)",
            version,
            *low,
        )
    return False


@final
class FoldRepeats(logging.Filter):
    """Pass the first warning or error of each kind, count its repeats for ``window`` seconds.

    A kind is the logger and the message template (``record.msg``), so
    "Unable connect to node with id %s" is one kind whatever the node. After
    the window the next one passes again, saying how many were held back.
    Records below WARNING pass untouched.
    """

    def __init__(
        self, window: float = FOLD_WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, object], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Decide whether ``record`` is logged; annotate it with the repeats held back."""
        if record.levelno < logging.WARNING:
            return True
        kind = (record.name, record.msg)
        now = self._clock()
        with self._lock:
            since, held = self._kinds.get(kind, (None, 0))
            if since is not None and now - since < self._window:
                self._kinds[kind] = (since, held + 1)
                return False
            self._kinds[kind] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {self._window:.0f}s)"
        return True


FOLD = FoldRepeats()
"""The one filter on aiokafka's loggers (see :func:`fold_aiokafka_logs`)."""


def fold_aiokafka_logs() -> None:
    """Put :data:`FOLD` on every aiokafka logger (idempotent; call after aiokafka is imported).

    Filters on a logger see only its own records, not its children's, so each
    module's logger gets it.
    """
    names = [name for name in logging.Logger.manager.loggerDict if _is_aiokafka(name)]
    for name in ["aiokafka", *names]:
        found = logging.getLogger(name)
        if FOLD not in found.filters:
            found.addFilter(FOLD)


def _is_aiokafka(name: str) -> bool:
    return name == "aiokafka" or name.startswith("aiokafka.")

"""Refused SASL logins of running clients: the signal to read a rotated password.

A started aiokafka client keeps the password it was built with and logs in
again with it whenever it reconnects (aiokafka has no KIP-368
re-authentication: a broker with ``connections.max.reauth.ms`` closes the
connection when the session ends, and the client reconnects). When that
password was revoked the client does not raise: it logs the broker's
``SaslAuthenticationFailed`` and retries forever. :func:`watch_refused_logins`
counts those records (by the exception they carry, not their words) in
:data:`REFUSED`; the source and the relay's sender compare the count with the
one they saw when they built their clients, and :class:`Login` tells them
whether the password file now holds another password (rebuild the clients)
or the same one (a refusal: exit 2).
"""

from __future__ import annotations

import logging
import threading
from typing import final

from ._refusals import AUTHENTICATION_ERRORS
from ._security import KafkaSecurity


@final
class _Refused(logging.Filter):
    """Count aiokafka records that carry a SASL authentication error; let every record pass."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Count ``record`` if an argument or its exception is a refused login."""
        carried = list(record.args) if isinstance(record.args, tuple) else []
        if record.exc_info:
            carried.append(record.exc_info[1])
        if any(isinstance(arg, AUTHENTICATION_ERRORS) for arg in carried):
            with self._lock:
                self.count += 1
        return True


REFUSED = _Refused()
"""The process's count of refused logins of running aiokafka clients."""


def watch_refused_logins() -> None:
    """Put :data:`REFUSED` first on aiokafka's loggers (before the folding of repeats).

    Idempotent; called when a source or a sender builds its clients.
    """
    names = [name for name in logging.Logger.manager.loggerDict if name.startswith("aiokafka.")]
    for name in ["aiokafka", *names]:
        found = logging.getLogger(name)
        if REFUSED not in found.filters:
            found.filters.insert(0, REFUSED)  # a dropping filter hides records from later ones


@final
class Login:
    """The SASL password a set of clients was built with, and the refusals seen since.

    :meth:`built` before building the clients; :meth:`refused` is one
    comparison (the hot path may ask it every turn); :meth:`rotated` reads the
    password file again, after a refusal only.
    """

    def __init__(self, security: KafkaSecurity) -> None:
        self._security = security
        self._password: str | None = None
        self._seen = REFUSED.count
        if security.sasl:
            watch_refused_logins()

    def built(self) -> None:
        """Remember the password the clients about to be built log in with."""
        self._seen = REFUSED.count
        self._password = self._security.password() if self._security.sasl else None

    def refused(self) -> bool:
        """Whether a running client's login was refused since :meth:`built` (or :meth:`seen`)."""
        return self._security.sasl and REFUSED.count != self._seen

    def seen(self) -> None:
        """Take the refusals so far as answered (another client's, or handled)."""
        self._seen = REFUSED.count

    def rotated(self) -> bool:
        """Whether the password file now holds another password than the clients have.

        Raises :class:`~leaseworker.ConfigError` when the file cannot be read.
        """
        return self._security.password() != self._password

"""Credentials kept in files, read again each time a connection is made.

The ``*_FILE`` convention of official container images: instead of
``LEASEWORKER_REDIS_URL`` a pod may be given ``LEASEWORKER_REDIS_URL_FILE``
(or ``--redis-url-file``) naming a file that holds the value, typically a
Kubernetes Secret mounted as a volume. Kubernetes updates such a file in
place when the Secret changes, so every reader here reads it again when it
opens a new connection (Redis, the store's pool, a Kafka client): a rotated
password is picked up without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import final

from ._errors import ConfigError


@final
@dataclass(frozen=True, slots=True)
class SecretFile:
    """A file holding one credential (a password, a URL with one); its repr shows the path only.

    ``setting`` names where the path came from (``--redis-url-file``), for errors.
    """

    path: Path
    setting: str

    def read(self) -> str:
        """Return the file's text without surrounding whitespace (a trailing newline, say).

        Raises :class:`ConfigError` naming the setting and the path, never the content,
        when the file cannot be read or is empty.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise ConfigError(f"cannot read {self.setting} {self.path}: {reason}") from None
        value = text.strip()
        if not value:
            raise ConfigError(f"{self.setting} {self.path} is empty")
        return value

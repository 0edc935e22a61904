"""A per-run test CA (trustme) and the PEM files a broker, a collector and clients load.

``TestCA`` writes each file once into its directory: the CA certificate,
a leaf's certificate chain, its key (PKCS#8, which Kafka's PEM keystore
reads and Python's ``ssl`` too) and a keystore (key + chain in one file, as
Kafka's ``ssl.keystore.type=PEM`` wants). A second, unrelated ``TestCA``
plays the CA a client does not trust.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization

LOOPBACK_NAMES = ("127.0.0.1", "localhost")
"""The names every server certificate here is valid for (the services bind loopback)."""


@dataclass(frozen=True, slots=True)
class Leaf:
    """The PEM files of one issued certificate."""

    cert: Path  # the certificate chain, leaf first
    key: Path  # the unencrypted PKCS#8 private key
    keystore: Path  # key then chain, in one file (Kafka's PEM keystore)


class TestCA:
    """A fresh certificate authority whose files live in ``directory``."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, directory: Path, name: str = "leaseworker test CA") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._ca = trustme.CA(organization_name=name)
        self.cert = directory / "ca.crt"
        self._ca.cert_pem.write_to_path(str(self.cert))

    def issue(
        self,
        name: str,
        *hosts: str,
        common_name: str | None = None,
        expired: bool = False,
    ) -> Leaf:
        """Issue a certificate for ``hosts`` (default: loopback) as ``name.*`` files.

        ``common_name`` becomes the subject's CN (a client certificate's
        principal); ``expired`` makes one that ended yesterday.
        """
        now = datetime.datetime.now(datetime.UTC)
        leaf = self._ca.issue_cert(
            *(hosts or LOOPBACK_NAMES),
            common_name=common_name,
            not_before=now - datetime.timedelta(days=2) if expired else None,
            not_after=now - datetime.timedelta(days=1) if expired else None,
        )
        key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
        pkcs8 = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        files = Leaf(
            cert=self.directory / f"{name}.crt",
            key=self.directory / f"{name}.key",
            keystore=self.directory / f"{name}.pem",
        )
        files.cert.write_bytes(chain)
        files.key.write_bytes(pkcs8)
        files.key.chmod(0o600)
        files.keystore.write_bytes(pkcs8 + chain)
        files.keystore.chmod(0o600)
        return files

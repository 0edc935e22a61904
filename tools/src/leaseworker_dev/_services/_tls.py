"""A certificate authority made for one run, and the PEM files the secured services read.

:class:`TestCA` (trustme, a development dependency, imported on first use)
issues server certificates for ``127.0.0.1``/``localhost``, client
certificates, and the certificates a refusal test needs: an expired one and
one for another host. Each is written as :class:`TLSFiles` (CA bundle,
certificate chain, PKCS#8 private key, which every server and client here
reads, and a keystore: key then chain in one file, Kafka's
``ssl.keystore.type=PEM``). A second ``TestCA`` is "an unknown CA" to the
first one's peers. The one CA helper of the suite, the demo and the secured
Kafka broker alike.
:class:`ServiceTLS` is what a secured local service is started with.
"""

from __future__ import annotations

import datetime
import itertools
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    import trustme

LOCAL_HOSTS = ("127.0.0.1", "localhost")
"""The names a local service's certificate is valid for."""


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """PEM files of one TLS identity: the CA bundle to trust, its certificate chain, its key.

    ``keystore``: the key and the chain in one file (a Kafka broker's PEM keystore).
    """

    ca: Path
    cert: Path
    key: Path
    keystore: Path


@final
class TestCA:
    """A throw-away certificate authority writing its certificates under ``directory``.

    ::

        ca = TestCA(tmp_path)
        server = ca.server()                  # valid for 127.0.0.1 and localhost
        client = ca.client("leaseworker")     # CN=leaseworker, for mTLS
        expired = ca.server(expired=True)     # the refusal tests' certificates
        elsewhere = ca.server(hosts=("db.invalid",))
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, directory: Path, name: str = "leaseworker test CA") -> None:
        import trustme  # a development dependency: only tests and demos get here

        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca: trustme.CA = trustme.CA(organization_name=name)
        self._numbers = itertools.count(1)
        self.ca_file = directory / "ca.crt"
        self._ca.cert_pem.write_to_path(str(self.ca_file))

    def server(
        self, *, hosts: tuple[str, ...] = LOCAL_HOSTS, expired: bool = False, name: str = "server"
    ) -> TLSFiles:
        """Issue a server certificate for ``hosts`` (``expired``: it ended yesterday)."""
        return self._issue(name, hosts, common_name=hosts[0], expired=expired)

    def client(self, common_name: str, *, expired: bool = False, name: str = "client") -> TLSFiles:
        """Issue a client certificate whose subject is ``CN=<common_name>``.

        It names the loopback hosts too: Go (Jaeger) and Java (Kafka) refuse a
        certificate whose subject alternative name extension is empty.
        """
        return self._issue(name, LOCAL_HOSTS, common_name=common_name, expired=expired)

    def _issue(
        self, name: str, hosts: tuple[str, ...], *, common_name: str, expired: bool
    ) -> TLSFiles:
        from cryptography.hazmat.primitives import serialization  # trustme's own dependency

        number = next(self._numbers)
        now = datetime.datetime.now(datetime.UTC)
        ends = now - datetime.timedelta(days=1) if expired else now + datetime.timedelta(days=30)
        leaf = self._ca.issue_cert(
            *hosts,
            common_name=common_name,
            not_before=now - datetime.timedelta(days=30),
            not_after=ends,
        )
        private = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
        pkcs8 = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        stem = self.directory / f"{name}-{number}"
        files = TLSFiles(
            ca=self.ca_file,
            cert=stem.with_suffix(".crt"),
            key=stem.with_suffix(".key"),
            keystore=stem.with_suffix(".pem"),
        )
        files.cert.write_bytes(chain)
        for secret, content in ((files.key, pkcs8), (files.keystore, pkcs8 + chain)):
            secret.write_bytes(content)
            secret.chmod(0o600)
        return files


@dataclass(frozen=True, slots=True)
class ServiceTLS:
    """A secured local service: its server identity and the client one its controls present.

    ``auth_clients``: whether the server asks every client for a certificate
    (Redis ``tls-auth-clients yes``); the service's own control connections
    (readiness probes, failovers) always present ``client``.
    """

    server: TLSFiles
    client: TLSFiles
    auth_clients: bool = True

    def client_context(self, *, verify: bool = True) -> ssl.SSLContext:
        """Return a client ``SSLContext`` presenting ``client``, trusting the CA.

        ``verify=False``: accept whatever certificate the server shows (a
        readiness probe of a server started with an expired one, on purpose).
        """
        context = ssl.create_default_context(cafile=str(self.server.ca))
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(str(self.client.cert), str(self.client.key))
        return context

    def redis_kwargs(self) -> dict[str, object]:
        """Return redis-py's keyword arguments for a control client of this service."""
        return {
            "ssl": True,
            "ssl_ca_certs": str(self.server.ca),
            "ssl_certfile": str(self.client.cert),
            "ssl_keyfile": str(self.client.key),
        }

    def redis_config(self, port: int) -> list[str]:
        """Return ``redis.conf`` lines serving TLS only on ``port`` (replication on TLS too)."""
        return [
            "port 0",
            f"tls-port {port}",
            f"tls-cert-file {self.server.cert}",
            f"tls-key-file {self.server.key}",
            f"tls-ca-cert-file {self.server.ca}",
            f"tls-auth-clients {'yes' if self.auth_clients else 'no'}",
            "tls-replication yes",
        ]

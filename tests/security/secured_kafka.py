"""The secured Kafka broker of tests/security: what a client needs to reach it, as whom.

The broker (started once per session by ``conftest.secured_kafka``) has an
``SSL`` listener that requires a client certificate, a ``SASL_SSL`` listener
with a PLAIN user and SCRAM users, two more ``SSL`` listeners with a
certificate for another host and an expired one, and the
``StandardAuthorizer``: a user can do only what its ACLs allow. Topics and
ACLs are created per test over the broker's own ``PLAINTEXT`` listener.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass

from leaseworker_dev._services import LocalKafka, TestCA
from leaseworker_dev._services._kafka_acls import Acl, pod_acls
from leaseworker_dev._services._kafka_secure import BrokerSecurity
from leaseworker_dev._services._tls import TLSFiles

from ..kafka_util import KafkaNames

USERS = ("pod", "nodl", "nogroup", "noread", "admin")
"""SCRAM users: ``pod`` gets the full pod ACLs, the others lack one (``admin`` is super)."""

REAUTH_MS = 3000
"""Sessions on the ``SASL_REAUTH`` listener end after this long: clients log in again."""


@dataclass(frozen=True)
class SecuredKafka:
    """The session's secured broker and what a client needs to reach it."""

    broker: LocalKafka
    ca: TestCA
    other_ca: TestCA  # a CA the broker's certificate does not chain to
    client: TLSFiles  # a client certificate whose principal is ``pod``
    stranger: TLSFiles  # a client certificate issued by ``other_ca``
    passwords: dict[str, str]  # SCRAM and PLAIN users' passwords

    def env(self, listener: str = "SASL_SSL", user: str = "pod", **more: str) -> dict[str, str]:
        """Return the ``LEASEWORKER_*`` variables of a pod on ``listener`` as ``user``."""
        env = {
            "LEASEWORKER_BOOTSTRAP_SERVERS": self.broker.address(listener),
            "LEASEWORKER_KAFKA_CA_FILE": str(self.ca.ca_file),
        }
        if listener == "SASL_SSL":
            env |= {
                "LEASEWORKER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "LEASEWORKER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "LEASEWORKER_KAFKA_SASL_USERNAME": user,
                "LEASEWORKER_KAFKA_SASL_PASSWORD": self.passwords.get(user, "no-such-user"),
            }
        else:
            env |= {
                "LEASEWORKER_KAFKA_SECURITY_PROTOCOL": "SSL",
                "LEASEWORKER_KAFKA_CERT_FILE": str(self.client.cert),
                "LEASEWORKER_KAFKA_KEY_FILE": str(self.client.key),
            }
        return env | more

    def names(
        self,
        user: str = "pod",
        *,
        group: bool = True,
        dead_letters: bool = True,
        read_topic: bool = True,
    ) -> KafkaNames:
        """Create a test's topics and grant ``user`` the pod ACLs (less what is turned off).

        ``read_topic=False`` grants only ``Describe`` on the job topic instead of ``Read``.
        """
        names = KafkaNames(uuid.uuid4().hex[:10])
        self.broker.create_topics([names.topic, names.dead_letters])
        acls = pod_acls(
            user,
            group=names.group,
            topic=names.topic,
            dead_letter_topic=names.dead_letters if dead_letters else None,
        )
        if not group:
            acls = [acl for acl in acls if acl.resource_type != "group"]
        if not read_topic:
            acls = [
                Acl(acl.principal, "describe", "topic", acl.resource_name)
                if acl.resource_name == names.topic
                else acl
                for acl in acls
            ]
        self.broker.grant(acls)
        return names


def start_secured_kafka(ca: TestCA, other: TestCA) -> SecuredKafka:
    """Start the broker of the module docstring, its certificates from ``ca``; stop it after."""
    passwords = {user: secrets.token_hex(12) for user in (*USERS, "plainpod")}
    security = BrokerSecurity(
        keystore=ca.server(name="broker").keystore,
        truststore=ca.ca_file,
        client_auth=True,
        plain_users={"plainpod": passwords["plainpod"]},
        scram_users={user: passwords[user] for user in USERS},
        authorizer=True,
        super_users=("admin",),
        more_listeners={
            "WRONGHOST": ca.server(hosts=("kafka.example.com",), name="wronghost").keystore,
            "EXPIRED": ca.server(expired=True, name="expired").keystore,
        },
        reauth_ms=REAUTH_MS,
    )
    broker = LocalKafka.start(security=security)
    client = ca.client("pod", name="kafka-client")
    stranger = other.client("pod", name="stranger")
    return SecuredKafka(broker, ca, other, client, stranger, passwords)

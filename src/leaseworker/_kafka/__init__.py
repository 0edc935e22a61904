"""The Kafka side: the consumer-group member whose records become executions.

``_trigger_source`` the ``KafkaTriggerSource`` (the poll loop and its operations);
``_state`` what its parts share (partitions, ``SourceStats``, the hooks);
``_commits`` committing the finished prefix; ``_offsets`` that prefix per
partition; ``_rebalance`` revoke and assign; ``_dead_letters`` malformed and
failed triggers; ``_kafka_clients`` building and starting the aiokafka clients;
``_log_names`` how log lines name partitions and errors; ``_security`` SASL/TLS
settings for every Kafka client; ``_settings`` the settings the source reads;
``_quiet`` keeps a Kafka outage quiet and cheap for every client;
``_refusals`` tells refused credentials, certificates and ACLs (exit 2) from
outages; ``_outbox_sender`` the relay's idempotent producer (``KafkaSender``);
``_trigger_producer`` sends one trigger (``leaseworker trigger``); ``_topic_admin``
creates topics (``leaseworker topics create``) and ``_topics`` checks them at
start, both with an admin client from ``_admin``. The only part of
the library that imports aiokafka (an import contract checks it; the
tools' local services use it too).
"""

from aiokafka.errors import KafkaError as KafkaError  # type: ignore[import-untyped]

from ._admin import started_admin as started_admin
from ._dead_letters import DEAD_LETTER_FAILURE_HEADERS as DEAD_LETTER_FAILURE_HEADERS
from ._dead_letters import DEAD_LETTER_HEADERS as DEAD_LETTER_HEADERS
from ._dead_letters import DEAD_LETTER_LOSS_HEADERS as DEAD_LETTER_LOSS_HEADERS
from ._dead_letters import DEAD_LETTER_OMITTED as DEAD_LETTER_OMITTED
from ._kafka_clients import new_consumer as new_consumer
from ._kafka_clients import new_producer as new_producer
from ._log_names import describe as describe_kafka_error
from ._outbox_sender import SEND_TIMEOUT as SEND_TIMEOUT
from ._outbox_sender import KafkaSender as KafkaSender
from ._refusals import refused_error as refused_error
from ._security import KafkaSecurity as KafkaSecurity
from ._settings import SourceSettings as SourceSettings
from ._state import Partition as Partition
from ._state import SourceStats as SourceStats
from ._topic_admin import create_topics as create_topics
from ._topics import _setting as config_setting
from ._trigger_producer import send_trigger as send_trigger
from ._trigger_source import KafkaTriggerSource as KafkaTriggerSource
from ._trigger_source import Taken as Taken

__all__ = [
    "DEAD_LETTER_FAILURE_HEADERS",
    "DEAD_LETTER_HEADERS",
    "DEAD_LETTER_LOSS_HEADERS",
    "DEAD_LETTER_OMITTED",
    "SEND_TIMEOUT",
    "KafkaError",
    "KafkaSecurity",
    "KafkaSender",
    "KafkaTriggerSource",
    "Partition",
    "SourceStats",
    "Taken",
    "config_setting",
    "create_topics",
    "describe_kafka_error",
    "new_consumer",
    "new_producer",
    "refused_error",
    "send_trigger",
    "started_admin",
]

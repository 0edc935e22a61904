"""The Kafka side: the consumer-group member that turns records into executions.

``_source`` the ``KafkaTriggerSource`` (poll, dispatch, commits, rebalances,
dead letters); ``_offsets`` the committable prefix of a partition;
``_security`` SASL/TLS settings for every Kafka client; ``_settings`` the
settings the source reads; ``_producer`` sends one trigger (``leaseworker
trigger``). The only part of the library that imports aiokafka (an import
contract checks it; the development services in ``_dev`` use it too).
"""

from ._producer import KafkaError as KafkaError
from ._producer import send_trigger as send_trigger
from ._security import KafkaSecurity as KafkaSecurity
from ._settings import SourceSettings as SourceSettings
from ._source import JobFailure as JobFailure
from ._source import KafkaTriggerSource as KafkaTriggerSource
from ._source import SourceStats as SourceStats

__all__ = [
    "JobFailure",
    "KafkaError",
    "KafkaSecurity",
    "KafkaTriggerSource",
    "SourceStats",
    "send_trigger",
]

"""Local stand-ins for production services, run as plain processes on loopback.

The demo and the test suite use these to start real Redis (alone, as a Sentinel
group or as a cluster), Kafka, PostgreSQL and Jaeger without Docker: every
service binds a free loopback port, is waited for until it answers, and is
stopped by PID. Downloads and builds are cached under
:func:`cache_dir`, outside any clone, so repeated runs are fast.

``_proc`` starts, waits for and stops a process; ``_redis`` one
``redis-server`` (on a wall clock ``_clock`` steps, if asked); ``_nodes``
one node of a replicated Redis topology;
``_sentinel`` a Sentinel group; ``_cluster`` a Redis Cluster; ``_hosts``
network namespaces on one bridge, hosts of their own that faults cut apart
(a service runs at a ``Place``: loopback, or such a host); ``_kafka`` (and
``_kafka_cluster``, three of its brokers),
``_local_postgres`` and ``_local_jaeger`` the other services; ``_postgres_pair`` a
PostgreSQL primary with a streaming standby, and its promotion; ``_local_stack`` the one stack
builder over them; ``_pods`` the one pod process (``leaseworker run`` with
``/readyz`` and a recorded history); ``_marked_work`` the CPU-bound work that
marks when it ran, and the kernel's exit times; ``_shipped`` finds the build files they
read, in a clone or in the wheel.
"""

from ._clock import WallClock as WallClock
from ._cluster import LocalRedisCluster as LocalRedisCluster
from ._hosts import Drops as Drops
from ._hosts import Host as Host
from ._hosts import Hosts as Hosts
from ._kafka import LocalKafka as LocalKafka
from ._kafka_cluster import NODE_IDS as NODE_IDS
from ._kafka_cluster import LocalKafkaCluster as LocalKafkaCluster
from ._local_jaeger import LocalJaeger as LocalJaeger
from ._local_postgres import LocalPostgres as LocalPostgres
from ._local_stack import LocalStack as LocalStack
from ._local_stack import Service as Service
from ._marked_work import MARKS_VARIABLE as MARKS_VARIABLE
from ._marked_work import ExitWatch as ExitWatch
from ._marked_work import crunch as crunch
from ._marked_work import marks_file as marks_file
from ._marked_work import read_marks as read_marks
from ._nodes import RedisNode as RedisNode
from ._pods import PodProcess as PodProcess
from ._pods import committed_total as committed_total
from ._pods import executions_of as executions_of
from ._pods import first_expiry as first_expiry
from ._pods import histories as histories
from ._pods import pod_process as pod_process
from ._pods import until_committed as until_committed
from ._pods import until_found as until_found
from ._pods import until_ready as until_ready
from ._postgres_pair import LocalPostgresPair as LocalPostgresPair
from ._proc import HERE as HERE
from ._proc import LocalProcess as LocalProcess
from ._proc import Place as Place
from ._proc import cache_dir as cache_dir
from ._proc import free_port as free_port
from ._proc import wait_for_port as wait_for_port
from ._redis import LocalRedis as LocalRedis
from ._sentinel import FailoverAborted as FailoverAborted
from ._sentinel import LocalSentinelGroup as LocalSentinelGroup
from ._shipped import ToolMissingError as ToolMissingError
from ._shipped import shipped as shipped
from ._tls import ServiceTLS as ServiceTLS
from ._tls import TestCA as TestCA

__all__ = [
    "HERE",
    "MARKS_VARIABLE",
    "NODE_IDS",
    "Drops",
    "ExitWatch",
    "FailoverAborted",
    "Host",
    "Hosts",
    "LocalJaeger",
    "LocalKafka",
    "LocalKafkaCluster",
    "LocalPostgres",
    "LocalPostgresPair",
    "LocalProcess",
    "LocalRedis",
    "LocalRedisCluster",
    "LocalSentinelGroup",
    "LocalStack",
    "Place",
    "PodProcess",
    "RedisNode",
    "Service",
    "ServiceTLS",
    "TestCA",
    "ToolMissingError",
    "WallClock",
    "cache_dir",
    "committed_total",
    "crunch",
    "executions_of",
    "first_expiry",
    "free_port",
    "histories",
    "marks_file",
    "pod_process",
    "read_marks",
    "shipped",
    "until_committed",
    "until_found",
    "until_ready",
    "wait_for_port",
]

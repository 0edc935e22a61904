"""One trigger's executions under its lease: the job, its context, its completion.

``_trigger`` decodes and validates a Kafka record into a ``Trigger``; ``_job``
``ReportJob`` and ``JobContext``; ``_checks`` a job class's checks at start;
``_result_checks`` a result's checks before it is stored; ``_completion`` the fenced
completion of one execution; ``_transaction`` its transaction and messages
(``ctx.transaction()``, ``ctx.publish()``); ``_executor`` runs a trigger's
executions (lookup, lease, job, completion, retries); ``_lookup`` the store
lookup a poll's triggers share; ``_events`` the logging hook (the events are
in ``leaseworker._events``). Knows no Kafka client, telemetry or CLI (an
import contract).
"""

from .._events import Ending as Ending
from .._events import ExecutionEvent as ExecutionEvent
from ._checks import check_job_class as check_job_class
from ._completion import completion_key as completion_key
from ._completion import job_key_of as job_key_of
from ._events import EVENT_LOG_LEVELS as EVENT_LOG_LEVELS
from ._events import ExecutionObserver as ExecutionObserver
from ._events import LoggingObserver as LoggingObserver
from ._events import ObserverHook as ObserverHook
from ._executor import Executor as Executor
from ._executor import LeaseNote as LeaseNote
from ._executor import Prepared as Prepared
from ._job import JobContext as JobContext
from ._job import ReportJob as ReportJob
from ._transaction import Transaction as Transaction
from ._trigger import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
from ._trigger import Trigger as Trigger
from ._trigger import check_job_key as check_job_key
from ._trigger import decode_trigger as decode_trigger
from ._trigger import resolve_job_key as resolve_job_key

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "EVENT_LOG_LEVELS",
    "Ending",
    "ExecutionEvent",
    "ExecutionObserver",
    "Executor",
    "JobContext",
    "LeaseNote",
    "LoggingObserver",
    "ObserverHook",
    "Prepared",
    "ReportJob",
    "Transaction",
    "Trigger",
    "check_job_class",
    "check_job_key",
    "completion_key",
    "decode_trigger",
    "job_key_of",
    "resolve_job_key",
]

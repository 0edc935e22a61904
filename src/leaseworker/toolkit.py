"""What leaseworker-dev (local services, demos, the fault campaign, the pytest plugin) may use.

The tools in ``tools/`` (the ``leaseworker_dev`` package, a distribution of
its own) reach the library through this module only, never through a private
module: the names below are their contract, and a change to one of them is a
change to both distributions. Each comes from a box's face, its ``__init__``:

- errors and jobs: ``ConfigError``, ``LeaseBusy``, ``LeaseLost``,
  ``LeaseUnavailable``, ``MalformedTrigger``; ``ReportJob``, ``JobContext``,
  ``completion_key``, ``decode_trigger``, ``resolve_job_key`` (``_execution``);
- leases (``_lease``): ``RedisLeases``, ``hold``, ``now`` (the lease clock),
  ``RELEASE`` (the release script, which the incident demo runs by hand),
  ``DeadlinePolicy`` (the takeover trials' local deadline); ``ProcessPool``
  (``_process``), the incident demo's pool for ``hold(..., processes=)``;
- the store (``_store``): ``open_store``, ``parse_store_url``, ``EffectStore``,
  ``effect_store`` (a store's outbox side), ``effect_id``; effects
  (``_effects``): ``Effect``, ``SqliteInbox``, ``CLAIM_HOLD``;
- Kafka (``_kafka``): ``KafkaSecurity``, ``create_topics``, ``send_trigger``,
  ``started_admin`` (an admin client, for SCRAM users and ACLs) and
  ``config_setting`` (one value of a described topic or broker config);
- the pod (``_worker``): ``Pod``, ``PodConfig``; its events (``_events``):
  ``Event``, ``ExecutionEvent``, ``SourceEvent``; ``SPAN_LOST``, the span
  name of a lost lease (``_telemetry``);
- histories (``_history``): ``History``, ``Execution``, ``FaultWindow``,
  ``Scalar``, ``merge``, ``header_line``, ``record_line``; drawing and Jaeger
  (``_timeline``): ``render_text``, ``render_html``, ``history_from_spans``,
  ``JaegerQuery``, ``JaegerSpan``, ``http_get``, ``https_context``;
- ``ChaosProxy`` (``_chaos``), the fault-injecting TCP proxy;
- the command line (``_cli``), for the tools' ``demo`` and ``chaos``:
  ``job_parser``, ``positive_int``, ``non_negative_int``, ``positive_seconds``,
  ``add_kafka_security_flags``, ``kafka_security_from``, ``load_job_class``;
- the testing kit (``testing``), for the plugin's embedded pod: ``JobResult``,
  ``ended`` and ``execution_step`` (how it builds one), ``DEAD_LETTER_SUFFIX``.

A name loads its box on first use (PEP 562), so that importing this module (the
pytest plugin does) loads no aiokafka, redis-py or tooling.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._chaos import ChaosProxy as ChaosProxy
    from ._cli import add_kafka_security_flags as add_kafka_security_flags
    from ._cli import job_parser as job_parser
    from ._cli import kafka_security_from as kafka_security_from
    from ._cli import load_job_class as load_job_class
    from ._cli import non_negative_int as non_negative_int
    from ._cli import positive_int as positive_int
    from ._cli import positive_seconds as positive_seconds
    from ._effects import CLAIM_HOLD as CLAIM_HOLD
    from ._effects import Effect as Effect
    from ._effects import SqliteInbox as SqliteInbox
    from ._errors import ConfigError as ConfigError
    from ._errors import LeaseBusy as LeaseBusy
    from ._errors import LeaseLost as LeaseLost
    from ._errors import LeaseUnavailable as LeaseUnavailable
    from ._errors import MalformedTrigger as MalformedTrigger
    from ._events import Event as Event
    from ._events import ExecutionEvent as ExecutionEvent
    from ._events import SourceEvent as SourceEvent
    from ._execution import JobContext as JobContext
    from ._execution import ReportJob as ReportJob
    from ._execution import completion_key as completion_key
    from ._execution import decode_trigger as decode_trigger
    from ._execution import resolve_job_key as resolve_job_key
    from ._history import Execution as Execution
    from ._history import FaultWindow as FaultWindow
    from ._history import History as History
    from ._history import Scalar as Scalar
    from ._history import header_line as header_line
    from ._history import merge as merge
    from ._history import record_line as record_line
    from ._kafka import KafkaSecurity as KafkaSecurity
    from ._kafka import config_setting as config_setting
    from ._kafka import create_topics as create_topics
    from ._kafka import send_trigger as send_trigger
    from ._kafka import started_admin as started_admin
    from ._lease import RELEASE as RELEASE
    from ._lease import DeadlinePolicy as DeadlinePolicy
    from ._lease import RedisLeases as RedisLeases
    from ._lease import hold as hold
    from ._lease import now as now
    from ._process import ProcessPool as ProcessPool
    from ._store import EffectStore as EffectStore
    from ._store import effect_id as effect_id
    from ._store import effect_store as effect_store
    from ._store import open_store as open_store
    from ._store import parse_store_url as parse_store_url
    from ._telemetry import SPAN_LOST as SPAN_LOST
    from ._timeline import JaegerQuery as JaegerQuery
    from ._timeline import JaegerSpan as JaegerSpan
    from ._timeline import history_from_spans as history_from_spans
    from ._timeline import http_get as http_get
    from ._timeline import https_context as https_context
    from ._timeline import render_html as render_html
    from ._timeline import render_text as render_text
    from ._worker import Pod as Pod
    from ._worker import PodConfig as PodConfig
    from .testing import JobResult as JobResult

    # The testing kit's face holds these three under private names (not its public API);
    # the type checker reads them where they are defined.
    from .testing._job_result import ended as ended
    from .testing._job_result import execution_step as execution_step
    from .testing._triggers import DEAD_LETTER_SUFFIX as DEAD_LETTER_SUFFIX

_FACES: dict[str, tuple[str, ...]] = {
    "._chaos": ("ChaosProxy",),
    "._cli": (
        "add_kafka_security_flags",
        "job_parser",
        "kafka_security_from",
        "load_job_class",
        "non_negative_int",
        "positive_int",
        "positive_seconds",
    ),
    "._effects": ("CLAIM_HOLD", "Effect", "SqliteInbox"),
    "._errors": ("ConfigError", "LeaseBusy", "LeaseLost", "LeaseUnavailable", "MalformedTrigger"),
    "._events": ("Event", "ExecutionEvent", "SourceEvent"),
    "._execution": (
        "JobContext",
        "ReportJob",
        "completion_key",
        "decode_trigger",
        "resolve_job_key",
    ),
    "._history": (
        "Execution",
        "FaultWindow",
        "History",
        "Scalar",
        "header_line",
        "merge",
        "record_line",
    ),
    "._kafka": (
        "KafkaSecurity",
        "config_setting",
        "create_topics",
        "send_trigger",
        "started_admin",
    ),
    "._lease": ("RELEASE", "DeadlinePolicy", "RedisLeases", "hold", "now"),
    "._process": ("ProcessPool",),
    "._store": ("EffectStore", "effect_id", "effect_store", "open_store", "parse_store_url"),
    "._telemetry": ("SPAN_LOST",),
    "._timeline": (
        "JaegerQuery",
        "JaegerSpan",
        "history_from_spans",
        "http_get",
        "https_context",
        "render_html",
        "render_text",
    ),
    "._worker": ("Pod", "PodConfig"),
    ".testing": ("JobResult", "DEAD_LETTER_SUFFIX", "ended", "execution_step"),
}
"""Each face and the names taken from it."""

_RENAMED = {"DEAD_LETTER_SUFFIX": "_DEAD_LETTER_SUFFIX", "ended": "_ended"}
_RENAMED["execution_step"] = "_execution_step"  # the testing kit's own, not its public API

_FACE_OF = {name: face for face, names in _FACES.items() for name in names}

__all__ = sorted(_FACE_OF, key=lambda name: (not name.isupper(), not name[0].isupper(), name))


def __getattr__(name: str) -> Any:
    """Import ``name``'s box on first use (PEP 562), then keep the name here."""
    if name not in _FACE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    face = importlib.import_module(_FACE_OF[name], "leaseworker")
    value = globals()[name] = getattr(face, _RENAMED.get(name, name))
    return value


def __dir__() -> list[str]:
    """List the contract's names, loaded or not."""
    return sorted({*__all__, *globals()})

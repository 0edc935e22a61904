"""The ``leaseworker`` command: one module per subcommand, no module imports another's.

``_main`` assembles the parser (importing only the module of the subcommand
being run, a library one or one of the ``leaseworker.commands`` entry points
of leaseworker-dev) and sets up logging; ``_common`` the shared flag helpers and
``LEASEWORKER_*`` environment defaults; ``_kafka_flags`` the Kafka security
flags shared by ``run``, ``trigger`` and ``chaos``; ``_jobs`` the job-class
loader shared by ``run`` and ``chaos``; ``_run_command``, ``_trigger_command``,
``_inspect_command``, ``_topics_command``, ``_timeline_command`` and
``_store_command`` the subcommands. The helpers are exported for the tools'
commands (through :mod:`leaseworker.toolkit`).
"""

from ._common import duration as duration
from ._common import job_parser as job_parser
from ._common import non_negative_int as non_negative_int
from ._common import positive_int as positive_int
from ._common import positive_seconds as positive_seconds
from ._jobs import load_job_class as load_job_class
from ._kafka_flags import add_kafka_security_flags as add_kafka_security_flags
from ._kafka_flags import kafka_security_from as kafka_security_from
from ._main import main as main

__all__ = [
    "add_kafka_security_flags",
    "duration",
    "job_parser",
    "kafka_security_from",
    "load_job_class",
    "main",
    "non_negative_int",
    "positive_int",
    "positive_seconds",
]

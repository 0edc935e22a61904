"""The ``leaseworker`` command: one module per subcommand, no module imports another's.

``_main`` assembles the parser (importing only the module of the subcommand
being run) and sets up logging; ``_common`` the shared flag helpers and
``LEASEWORKER_*`` environment defaults; ``_kafka_flags`` the Kafka security
flags shared by ``run`` and ``trigger``; ``_jobs`` the job-class loader shared
by ``run`` and ``chaos``; ``_run``, ``_trigger``, ``_inspect``, ``_topics``,
``_timeline``, ``_chaos`` and ``_demo`` the subcommands.
"""

from ._main import main as main

__all__ = ["main"]

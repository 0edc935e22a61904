"""leaseworker-dev: the tools around the leaseworker library, a distribution of their own.

Not the library: nothing here runs in a production pod, and the library never
imports it (an import contract checks both ways). It reaches the library
through :mod:`leaseworker.toolkit` only, whose names are its contract.

``_services`` starts real Redis (one node, Sentinel, Cluster), Kafka,
PostgreSQL and Jaeger as local processes, the one stack builder over them
and the one pod process (``leaseworker run`` as a child); ``_demos`` the
local stack demo, the incident and the failover demos; ``_campaign`` the
seeded fault campaign and its checker; ``_cli`` the ``demo`` and ``chaos``
commands, which ``leaseworker`` finds through the ``leaseworker.commands``
entry points; ``pytest_plugin`` the pytest fixtures for real services and
``_embedded`` its embedded pod; ``_suite_report`` the repository's own suite
report (wall time per test directory). The wheel carries the build files the
services read (Kafka's pom, Jaeger's Go module, the demo's jobs) under
``_shipped``.
"""

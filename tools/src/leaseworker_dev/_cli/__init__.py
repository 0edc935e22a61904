"""The tools' ``leaseworker`` subcommands: ``demo`` and ``chaos``, one module each.

``leaseworker``'s parser finds them through the ``leaseworker.commands``
entry points (tools/pyproject.toml) and imports the one being run; each
module registers itself with ``add_parser(subparsers, summary)``, as the
library's own subcommands do.
"""

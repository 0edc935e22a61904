"""The package version, read by the build backend and ``leaseworker --version``."""

__version__ = "0.1.0"

"""leaseworker: run long jobs safely across many worker pods."""
from ._version import __version__ as __version__

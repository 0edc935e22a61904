"""Load the job class a ``pkg.module:JobClass`` argument names (``run`` and ``chaos`` take one).

Its own module, so that one subcommand does not import another's.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from .._errors import ConfigError
from .._execution import ReportJob, check_job_class


def load_job_class(spec: str) -> type[ReportJob]:
    """Import ``pkg.module:JobClass`` and check it is a concrete ReportJob subclass.

    The current directory is put on ``sys.path`` first (as ``python -m`` does),
    so jobs in the project being deployed import without installing it. Raises
    :class:`ConfigError` with a one-line reason.
    """
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"job must look like pkg.module:JobClass, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises at import
        raise ConfigError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    job_class = getattr(module, class_name, None)
    if not (inspect.isclass(job_class) and issubclass(job_class, ReportJob)):
        raise ConfigError(f"{spec} is not a ReportJob subclass")
    if inspect.isabstract(job_class):
        raise ConfigError(f"{spec} is abstract: implement async def run(self, ctx)")
    check_job_class(job_class)
    return job_class

"""Job results: checked before the store sees them, so a bad one fails fast and says why.

A result is stored as strict JSON, and every store must give back what it was
given. So the checker refuses what JSON cannot say (a ``datetime``, a ``set``,
``bytes``, ``NaN``), what it would silently change (a non-string mapping key:
``{1: "a"}`` would come back as ``{"1": "a"}``), text no store keeps (NUL, a
lone surrogate) and results over the size bound, with :class:`BadResult` (a
``bad_result`` dead letter). Messages name types and sizes, never values.
"""

from __future__ import annotations

import json
import math
import re

from .._errors import BadResult

DEFAULT_MAX_RESULT_BYTES = 1 << 20
"""Results whose JSON is larger than this (1 MiB) are refused: a report's result is a summary."""

_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SCALARS = (str, int, float, bool, type(None))


def check_result(key: str, result: object, *, max_bytes: int) -> None:
    """Return if ``result`` can be stored as it is; else raise :class:`BadResult`.

    ``key`` is the job key, for the message. The walk is iterative, so deep
    nesting cannot exhaust the stack; the size is that of the compact JSON.
    """
    _check_shape(key, result)
    try:
        size = len(_ENCODER.encode(result).encode("utf-8", "surrogatepass"))
    except RecursionError:
        raise BadResult(key, "nested too deeply for JSON") from None
    if size > max_bytes:
        raise BadResult(key, f"its JSON is {size} bytes, limit {max_bytes} (max_result_bytes)")


def _check_shape(key: str, result: object) -> None:
    stack = [result]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            _check_keys(key, item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        else:
            _check_scalar(key, item)


def _check_keys(key: str, mapping: dict[object, object]) -> None:
    for name in mapping:
        if not isinstance(name, str):
            raise BadResult(
                key,
                f"it has a {type(name).__name__} mapping key; JSON keys are strings "
                "(it would come back as a string)",
            )
        _check_scalar(key, name)


def _check_scalar(key: str, item: object) -> None:
    if isinstance(item, str):
        if _UNSTORABLE.search(item):
            raise BadResult(key, "it holds text with NUL or a surrogate code point")
    elif isinstance(item, float):
        if not math.isfinite(item):
            raise BadResult(key, f"it holds {item!r}, which JSON has no value for")
    elif not isinstance(item, _SCALARS):
        raise BadResult(key, f"it holds a {type(item).__name__}, which is not JSON")

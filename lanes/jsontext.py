"""Compact JSON text through orjson, with the standard library's meaning kept exactly.

``dumps(value)`` is what ``json.dumps(value, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)`` writes, character for character, and it
refuses what that refuses, with the same exceptions: a payload's text is its
idempotency digest and its size, so neither may move with the encoder. orjson
writes that text several times faster; where it would write something else it
is not trusted, and the standard library writes the value instead:

- it raises (a dict key that is not a str, an int past 64 bits, nesting past
  254, a lone surrogate, a subclass or any type it is not asked to take);
- what it wrote does not read back equal to the value: NaN and infinities
  (orjson writes ``null``), and the types it writes that ``json`` refuses
  (``uuid.UUID``, ``enum.Enum``, ``orjson.Fragment``), and tuples;
- it wrote a float of magnitude below 1e-4, which it spells ``0.00001`` or
  ``1e-7`` where ``json`` writes ``1e-05`` and ``1e-07``.

``tests/unit/test_jsontext.py`` holds the two equal over generated values.

``kombu_text(value)`` is the other text the platform writes on every task: a
result row's columns, in Celery's ``json`` serializer (``kombu.utils.json.dumps``).
That call builds an encoder a call (a third of its cost: 3 a task, 18 µs of a
worker's CPU a task under a no-op backlog); its encoder differs from the
standard library's at its defaults only by ``default``, the hook for a type
``json`` does not take. So a value without such a type is written by an encoder
built once, and anything else (``None`` back) by kombu's own call.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

#: The reference: the standard library's encoder, built once, no check for cycles (a cycle recurses
#: until RecursionError, which callers take as "not JSON", like any value json refuses).
_REFERENCE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False)
#: Whatever orjson would take in a way of its own goes to ``default``, which refuses it.
_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
#: orjson's spelling of a float with a one-digit negative exponent (json writes two digits).
_SHORT_EXPONENT = re.compile(r"\de-\d(?!\d)")


#: The standard library's encoder at its defaults, built once: what kombu's JSON encoder is, less ``default``.
_DEFAULTS = json.JSONEncoder()


def kombu_text(value: Any) -> str | None:
    """What ``kombu.utils.json.dumps(value)`` writes, when no part of ``value`` needs its ``default`` hook
    (a datetime, a UUID, bytes, ``__json__``, ...); None: not written here, kombu's call writes it (or raises)."""
    try:
        return _DEFAULTS.encode(value)
    except (TypeError, ValueError, RecursionError):
        return None


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> str:
    """Compact JSON of ``value`` as ``json.dumps`` writes it (see the module); raises as it does, and
    ``UnicodeEncodeError`` on a lone surrogate (text that is not UTF-8)."""
    try:
        out = orjson.dumps(value, default=_refuse, option=_STRICT)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return reference_dumps(value)
    text = out.decode()  # the tests below on str: ``in`` on bytes costs five times more
    if ".0000" in text or ("e-" in text and _SHORT_EXPONENT.search(text)) or orjson.loads(out) != value:
        return reference_dumps(value)
    return text


def reference_dumps(value: Any) -> str:
    """The standard library's text of ``value`` (``dumps`` without orjson)."""
    text = _REFERENCE.encode(value)
    if not text.isascii():
        text.encode("utf-8")  # a lone surrogate raises here
    return text

"""Measurement only: the platform without its metrics and lifecycle signals.

Imported (through ``DISPATCH_HOOK_MODULES``) by the workers of the "off" variant
of ``scripts/measure_overhead.py``: the Lua scripts are loaded with their
counting helpers turned into no-ops, and ``tasks.signals`` sends nothing. Never
used by the platform itself.
"""

from __future__ import annotations

import functools

from lanes.lua import loader
from tasks import signals as hooks

#: The counting helpers of the scripts; each gets an early return.
COUNTING_FUNCTIONS = (
    "local function count_to(total_key, minute_key, field)",
    "local function observe(total_key, minute_key, name, suffix, bucket, seconds)",
    "local function admit_count(c, kind, extra)",
)

_original_source = loader._source
_original_send = hooks._send


def stripped_source(name: str, directory=None) -> str:
    text = _original_source(name, directory)
    for head in COUNTING_FUNCTIONS:
        text = text.replace(head, head + "\n  do return end", 1)
    return text


def _no_send(signal, info) -> None:
    return None


def enable() -> None:
    """Strip the metrics from scripts loaded from now on, and stop sending signals."""
    # Read from the files: a script's source holds only the _lib.lua functions it uses (observe: none).
    lua = "".join((loader.SCRIPT_DIR / name).read_text() for name in ("_lib.lua", "_admit.lua", "_admit_rare.lua"))
    missing = [head for head in COUNTING_FUNCTIONS if head not in lua]
    assert not missing, f"the scripts' counting helpers changed, update this module: {missing}"
    loader._source = functools.cache(stripped_source)
    loader._scripts.clear()
    hooks._send = _no_send


def disable() -> None:
    loader._source = _original_source
    loader._scripts.clear()
    hooks._send = _original_send


enable()

"""The trace carrier a message's envelope holds (``Envelope.trace``), in pure functions: no OpenTelemetry here.

A carrier is what the propagator writes (W3C ``traceparent``/``tracestate``), plus
two keys of our own on a retry's message: the previous attempt's span (the next
attempt's link) and when the retry was due (its wait in the lane counts from then).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

#: The carrier key holding the previous attempt's span (a W3C ``traceparent``): the retry's link.
PREV_KEY = "dispatch-prev"
#: The carrier key holding when a retry was due (epoch seconds, as text): its wait in the lane counts from it.
READY_KEY = "dispatch-ready"
#: The exporter of our own: each span a JSON line appended to ``DISPATCH_TRACES_FILE``.
JSONL_EXPORTER = "jsonl"


def exporter_names(value: str) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, in order; ``none`` (or nothing) is none."""
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    return [name for name in dict.fromkeys(names) if name != "none"]


def ready_at(carrier: Mapping[str, str] | None, default: float) -> float:
    """When the attempt could start: the retry's due time the carrier holds, else ``default``."""
    text = carrier.get(READY_KEY) if carrier else None
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        return default


def retry_carrier(carrier: Mapping[str, str] | None, parent: Mapping[str, str], attempt_traceparent: str,
                  ready_s: float) -> dict[str, str]:
    """The next attempt's carrier: the dispatch's context (``parent``, this attempt's, when the dispatch had
    none), a link to this attempt, and when the retry is due."""
    out = {k: v for k, v in (carrier or {}).items() if k not in (PREV_KEY, READY_KEY)}
    if "traceparent" not in out:
        out.update(parent)
    out[PREV_KEY] = attempt_traceparent
    out[READY_KEY] = f"{ready_s:.6f}"
    return out


class Traced(Protocol):
    """What the hooks read of an attempt (``tasks.execution.Attempt``)."""

    env: Any
    task_id: str
    task: Any
    span: Any

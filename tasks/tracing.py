"""One trace from ``dispatch.delay`` to the handler: the platform's hooks, off unless configured.

Tracing is on in a process once :func:`configure` (``TasksConfig.ready``) finds an
exporter named by the standard ``OTEL_TRACES_EXPORTER`` (``console``, ``otlp`` when
installed, or this platform's ``jsonl``: spans as JSON lines appended to
``DISPATCH_TRACES_FILE``), or a tracer provider the process set up itself. Off, every
hook returns at its first line and OpenTelemetry's tracing is not even imported: a dispatch's
message carries no trace field, and no span is made (cheaper than the API's own no-op
tracer, which still builds a non-recording span per call).

On, the spans live in ``tasks.spans``: ``dispatch <type>`` around admission in the
caller (its context injected into the message's envelope, ``Envelope.trace``, by the
global propagator: W3C ``traceparent``/``tracestate``), then in the worker
``wait <lane>`` (enqueue to start), ``run <type>`` per attempt (a retry is a new
attempt span of the same trace, linked to the previous one), ``handler <name>``
around the handler, and ``dead_letter <type>``.

The carrier's two keys of our own ride beside the propagator's: the previous
attempt's ``traceparent`` (the retry's link) and when the retry was due (its
queue wait); ``tasks.trace_carrier`` reads and writes them (pure functions).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from tasks.trace_carrier import Traced, exporter_names


class _Untraced:
    """The dispatch hook's answer while tracing is off: every method does nothing."""

    __slots__ = ()

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def carry(self, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def answered(self, results: Sequence[Any]) -> None:
        return None


_UNTRACED = _Untraced()
_NULL = contextlib.nullcontext()
#: The spans of this process (``tasks.spans.Spans``) while tracing is on; None: off.
_spans: Any = None


def enabled() -> bool:
    return _spans is not None


def enable(tracer: Any) -> None:
    """Trace with ``tracer`` (an OpenTelemetry ``Tracer``) from now on: what :func:`configure` does, and tests."""
    global _spans
    # inner import: OpenTelemetry is imported only once tracing is on
    from tasks import spans

    _spans = spans.Spans(tracer)


def disable() -> None:
    global _spans
    _spans = None


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on if ``OTEL_TRACES_EXPORTER`` names an exporter (or the process set up a tracer provider of
    its own); True if on. ``OTEL_SDK_DISABLED=true`` keeps it off. Called once, from ``TasksConfig.ready``."""
    env = os.environ if environ is None else environ
    if _spans is not None:
        return True
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = exporter_names(env.get("OTEL_TRACES_EXPORTER", ""))
    api = sys.modules.get("opentelemetry.trace")  # a provider of the process's own was set through the API
    if not names and (api is None or type(api.get_tracer_provider()).__name__ in ("ProxyTracerProvider",
                                                                                   "NoOpTracerProvider")):
        return False
    # inner import: OpenTelemetry is imported only once tracing is on
    from tasks import spans

    try:
        tracer = spans.tracer_from_environment(names, env)
    except spans.UnknownExporter as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    enable(tracer)
    return True


# -- the hooks (each returns at once while tracing is off) ---------------------------------------
def dispatching(task_type: Any, count: int) -> Any:
    """The ``dispatch <type>`` span of one call admitting ``count`` tasks, in the caller's thread (a context
    manager: ``carry(options)`` adds the trace to the items' options, ``answered(results)`` notes the results)."""
    if _spans is None:
        return _UNTRACED
    return _spans.dispatching(task_type, count)


def remote_parent(headers: Mapping[str, str]) -> contextlib.AbstractContextManager[Any]:
    """While in it, the caller's W3C ``traceparent`` (HTTP request headers) is the current context."""
    if _spans is None or not headers.get("traceparent"):
        return _NULL
    return _spans.remote_parent(headers)


def start_attempt(attempt: Traced, now: float) -> None:
    """The attempt's ``wait <lane>`` span (ended at ``now``) and its ``run <type>`` span (started at ``now``)."""
    if _spans is not None:
        _spans.start_attempt(attempt, now)


def handler_span(attempt: Traced, others: Sequence[Traced] = ()) -> contextlib.AbstractContextManager[Any]:
    """The ``handler <name>`` span, current while the handler runs (a batch's: linked to ``others``)."""
    if _spans is None or attempt.span is None:
        return _NULL
    return _spans.handler(attempt, others)


def outcome(attempt: Traced, outcome: str, *, reason: str = "", detail: str = "",
            retry_delay_s: float | None = None) -> None:
    """The attempt's outcome recorded in Redis: its span notes it and ends."""
    if _spans is not None and attempt.span is not None:
        _spans.outcome(attempt, outcome, reason, detail, retry_delay_s)


def end_attempt(attempt: Traced) -> None:
    """End the attempt's span if no outcome did (a skipped claim, a finish another worker took, an error)."""
    if attempt.span is not None:
        span, attempt.span = attempt.span, None
        span.end()


def dead_letter(attempt: Traced, reason: str, detail: str) -> None:
    """The ``dead_letter <type>`` span (an instant, as the task becomes a dead letter), in its attempt's span."""
    if _spans is not None:
        _spans.dead_letter(attempt, reason, detail)


def next_trace(attempt: Traced, ready_s: float) -> dict[str, str] | None:
    """The carrier of the retry of ``attempt``, due at ``ready_s`` (unchanged while tracing is off here)."""
    if _spans is None or attempt.span is None:
        return attempt.env.trace
    return _spans.next_trace(attempt, ready_s)


@contextlib.contextmanager
def spans_of_process(tracer: Any) -> Iterator[None]:
    """Trace with ``tracer`` inside the block, then as before (tests)."""
    global _spans
    before = _spans
    enable(tracer)
    try:
        yield
    finally:
        _spans = before

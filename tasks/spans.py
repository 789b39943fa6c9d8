"""The spans of a task's life with OpenTelemetry; imported only once tracing is on (``tasks.tracing`` is the switch).

Attributes follow OpenTelemetry's messaging conventions where they fit (a dispatch
is a ``send`` to the lane, an attempt a ``process`` of the message, the chat the
message's conversation), plus ``dispatch.*`` names for what they do not have.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tasks import trace_carrier
from tasks.trace_carrier import Traced

#: ``messaging.system``: the workers are Celery's, the broker Redis.
SYSTEM = "celery"
#: Characters of an error's text kept in a span's status.
DETAIL_MAX = 300
_W3C = TraceContextTextMapPropagator()


class UnknownExporter(ValueError):
    """``OTEL_TRACES_EXPORTER`` names an exporter that is not installed (or misses its setting)."""


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class Dispatching:
    """The ``dispatch <type>`` span of one call (one task, or a bulk call's items), in the caller's context."""

    __slots__ = ("carrier", "span")

    def __init__(self, tracer: trace.Tracer, task_type: Any, count: int) -> None:
        name = task_type[:100] if isinstance(task_type, str) else "?"
        attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.operation.type": "send",
                                      "messaging.operation.name": "dispatch", "dispatch.type": name}
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        self.span = tracer.start_span(f"dispatch {name}", kind=SpanKind.PRODUCER, attributes=attributes)
        self.carrier: dict[str, str] = {}
        propagate.inject(self.carrier, context=trace.set_span_in_context(self.span))

    def __enter__(self) -> Dispatching:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:DETAIL_MAX]))
        self.span.end()

    def carry(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with the trace for the message (``tasks.admission.prepare``'s ``trace``)."""
        return {**options, "trace": self.carrier} if self.carrier else options

    def answered(self, results: Sequence[Any]) -> None:
        span = self.span
        if not span.is_recording():
            return
        queue = next((r.queue for r in results if r.queue), None)
        if queue:
            span.set_attribute("messaging.destination.name", queue)
        unavailable = [r for r in results if r.reason == "unavailable"]
        if len(results) == 1:
            result = results[0]
            span.set_attribute("dispatch.accepted", result.accepted)
            if result.task_id:
                span.set_attribute("messaging.message.id", result.task_id)
                span.set_attribute("dispatch.task_id", result.task_id)
            if result.chat_id:
                span.set_attribute("messaging.message.conversation_id", result.chat_id)
                span.set_attribute("dispatch.chat", result.chat_id)
            if result.duplicate:
                span.set_attribute("dispatch.duplicate", True)
            if result.reason:
                span.set_attribute("dispatch.reason", result.reason)
            if result.priority is not None:
                span.set_attribute("dispatch.priority", result.priority)
        else:
            accepted = sum(1 for r in results if r.accepted)
            span.set_attribute("dispatch.accepted_count", accepted)
            span.set_attribute("dispatch.rejected_count", len(results) - accepted)
        if unavailable:
            span.set_status(Status(StatusCode.ERROR, unavailable[0].detail[:DETAIL_MAX]))


def _attributes(attempt: Traced) -> dict[str, Any]:
    env = attempt.env
    out: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "run",
        "messaging.destination.name": env.lane, "messaging.message.id": attempt.task_id,
        "dispatch.task_id": attempt.task_id, "dispatch.type": env.type, "dispatch.lane": env.lane,
        "dispatch.attempt": env.attempt, "dispatch.priority": env.priority,
    }
    if env.chat:
        out["messaging.message.conversation_id"] = out["dispatch.chat"] = env.chat
    return out


class Spans:
    """The spans of one process, made by one tracer."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def dispatching(self, task_type: Any, count: int) -> Dispatching:
        return Dispatching(self.tracer, task_type, count)

    @contextmanager
    def remote_parent(self, headers: Mapping[str, str]) -> Any:
        carrier = {name: headers[name] for name in ("traceparent", "tracestate") if headers.get(name)}
        token = otel_context.attach(_W3C.extract(carrier))
        try:
            yield
        finally:
            otel_context.detach(token)

    def start_attempt(self, attempt: Traced, now: float) -> None:
        env = attempt.env
        carrier = env.trace
        parent = propagate.extract(carrier) if carrier else None
        ready = trace_carrier.ready_at(carrier, env.ready_at)
        attributes = _attributes(attempt)
        waited = max(0.0, now - ready)
        attributes["dispatch.queue_wait_s"] = round(waited, 6)
        wait = self.tracer.start_span(f"wait {env.lane}", context=parent, start_time=_ns(min(ready, now)),
                                      attributes={**attributes, "messaging.operation.name": "wait"})
        wait.end(end_time=_ns(now))
        links = []
        previous = carrier.get(trace_carrier.PREV_KEY) if carrier else None
        if previous:
            linked = trace.get_current_span(_W3C.extract({"traceparent": previous})).get_span_context()
            if linked.is_valid:
                links.append(Link(linked, {"dispatch.link": "previous_attempt"}))
        attempt.span = self.tracer.start_span(f"run {env.type}", context=parent, kind=SpanKind.CONSUMER,
                                              links=links, start_time=_ns(now), attributes=attributes)

    def handler(self, attempt: Traced, others: Sequence[Traced]) -> AbstractContextManager[Any]:
        name = attempt.task.name
        links = [Link(other.span.get_span_context()) for other in others
                 if other is not attempt and other.span is not None]
        attributes: dict[str, Any] = {"dispatch.handler": name, "dispatch.task_id": attempt.task_id}
        if others:
            attributes["messaging.batch.message_count"] = len(others)
        span = self.tracer.start_span(f"handler {name}", context=trace.set_span_in_context(attempt.span),
                                      links=links, attributes=attributes)
        return trace.use_span(span, end_on_exit=True)

    def outcome(self, attempt: Traced, outcome: str, reason: str, detail: str,
                retry_delay_s: float | None) -> None:
        span, attempt.span = attempt.span, None
        span.set_attribute("dispatch.outcome", outcome)
        if reason:
            span.set_attribute("dispatch.reason", reason)
        if retry_delay_s is not None:
            span.set_attribute("dispatch.retry_delay_s", round(retry_delay_s, 6))
        if outcome in ("retrying", "dead"):
            span.set_status(Status(StatusCode.ERROR, (detail or reason)[:DETAIL_MAX]))
        span.end()

    def dead_letter(self, attempt: Traced, reason: str, detail: str) -> None:
        if attempt.span is not None:
            parent = trace.set_span_in_context(attempt.span)
        elif attempt.env.trace:
            parent = propagate.extract(attempt.env.trace)
        else:
            return  # no trace to join: a dead letter before any attempt, of an untraced dispatch
        env = attempt.env
        span = self.tracer.start_span(f"dead_letter {env.type}", context=parent, attributes={
            "dispatch.task_id": attempt.task_id, "dispatch.type": env.type, "dispatch.lane": env.lane,
            "dispatch.attempt": env.attempt, "dispatch.reason": reason})
        span.set_status(Status(StatusCode.ERROR, detail[:DETAIL_MAX]))
        span.end()

    def next_trace(self, attempt: Traced, ready_s: float) -> dict[str, str]:
        context = trace.set_span_in_context(attempt.span)
        parent: dict[str, str] = {}
        propagate.inject(parent, context=context)
        own: dict[str, str] = {}
        _W3C.inject(own, context=context)
        return trace_carrier.retry_carrier(attempt.env.trace, parent, own.get("traceparent", ""), ready_s)


class JsonLinesExporter(SpanExporter):
    """``OTEL_TRACES_EXPORTER=jsonl``: each span one JSON line (``ReadableSpan.to_json``) appended to a file.

    One ``write`` per batch on an ``O_APPEND`` descriptor, so the processes of a worker (prefork) may share the
    file. A local file for a quick look or a test, where no collector runs.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        text = "".join(span.to_json(indent=None) + "\n" for span in spans).encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, text)
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _exporter(name: str, env: Mapping[str, str]) -> Any:
    if name == trace_carrier.JSONL_EXPORTER:
        path = env.get("DISPATCH_TRACES_FILE", "")
        if not path:
            raise UnknownExporter("OTEL_TRACES_EXPORTER=jsonl needs DISPATCH_TRACES_FILE: the file the spans are "
                                  "appended to")
        return JsonLinesExporter(path)
    found = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    if name not in found:
        known = ", ".join(sorted({*found, trace_carrier.JSONL_EXPORTER}))
        raise UnknownExporter(f"OTEL_TRACES_EXPORTER names {name!r}: no such span exporter is installed "
                              f"(installed: {known}; the OTLP one is the package opentelemetry-exporter-otlp)")
    return found[name].load()()


def tracer_from_environment(names: list[str], env: Mapping[str, str]) -> trace.Tracer:
    """The tracer of a provider built from the ``OTEL_*`` variables (exporters ``names``, each behind a batch
    processor, as the SDK's own autoconfiguration does), or of the provider the process already set."""
    current = trace.get_tracer_provider()
    if not names or isinstance(current, TracerProvider):
        return current.get_tracer("dispatch")
    exporters = [_exporter(name, env) for name in names]
    resource = Resource.create({} if env.get("OTEL_SERVICE_NAME") else {"service.name": "dispatch"})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER, as the SDK reads it
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # the handlers' own spans join the same traces
    return provider.get_tracer("dispatch")

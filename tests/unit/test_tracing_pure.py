"""The trace carrier's pure helpers and tracing's switch (tasks/trace_carrier.py, tasks/tracing.py)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from tasks import trace_carrier, tracing
from tasks.bulk import split_item
from tasks.validation import Invalid

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ATTEMPT = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"


def test_exporter_names_are_read_as_the_sdk_reads_them():
    assert trace_carrier.exporter_names("") == [] == trace_carrier.exporter_names("none")
    assert trace_carrier.exporter_names(" Console, jsonl ,none,console") == ["console", "jsonl"]


def test_a_retry_keeps_the_dispatchs_parent_and_links_the_attempt_before():
    first = trace_carrier.retry_carrier({"traceparent": PARENT, "tracestate": "k=v"}, {"traceparent": ATTEMPT},
                                        ATTEMPT, 12.5)
    assert first == {"traceparent": PARENT, "tracestate": "k=v", trace_carrier.PREV_KEY: ATTEMPT,
                     trace_carrier.READY_KEY: "12.500000"}
    again = trace_carrier.retry_carrier(first, {"traceparent": "ignored"}, "00-next", 20.0)
    assert again["traceparent"] == PARENT and again[trace_carrier.PREV_KEY] == "00-next"
    # A dispatch that was not traced: the first traced attempt becomes the parent of the next ones.
    untraced = trace_carrier.retry_carrier(None, {"traceparent": ATTEMPT}, ATTEMPT, 1.0)
    assert untraced["traceparent"] == ATTEMPT
    assert trace_carrier.ready_at(again, 3.0) == 20.0
    assert trace_carrier.ready_at(None, 3.0) == 3.0 == trace_carrier.ready_at({trace_carrier.READY_KEY: "x"}, 3.0)


def test_off_unless_an_exporter_is_named_and_an_unknown_one_is_named_in_the_error():
    assert not tracing.configure({}) and not tracing.configure({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.configure({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"})
    with pytest.raises(ImproperlyConfigured, match=r"'nope'.*installed: console, jsonl"):
        tracing.configure({"OTEL_TRACES_EXPORTER": "nope"})
    with pytest.raises(ImproperlyConfigured, match="DISPATCH_TRACES_FILE"):
        tracing.configure({"OTEL_TRACES_EXPORTER": "jsonl"})
    assert not tracing.enabled()


def test_a_caller_cannot_pass_a_trace_as_a_dispatch_option():
    with pytest.raises(Invalid) as err:
        split_item(({}, {"trace": {"traceparent": PARENT}}), {})
    assert "unknown dispatch options: 'trace'" in err.value.detail

"""One trace from ``dispatch.delay`` to the handler, across the process boundary (tasks/tracing.py).

The caller is this process, traced into the SDK's ``InMemorySpanExporter``; the workers are real Celery
processes traced from the standard variables (``OTEL_TRACES_EXPORTER=jsonl``: their spans as JSON lines
in a file). The parent links are read from both: the caller's span is the parent of ``dispatch <type>``,
whose context the message carries to the worker's ``wait``/``run`` spans (the break users report with
Celery's own instrumentation: its worker spans start traces of their own).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lanes import keys
from tasks import tracing
from tasks.dispatch import dispatch, dispatch_many
from tests.support.api_client import ApiClient, make_token
from tests.support.helpers import define, unique, wait_until
from tests.support.workers import ROOT, Worker

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans():
    """This process traced into memory while the test runs (then off again, as the suite runs)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracing.spans_of_process(provider.get_tracer("dispatch")):
        yield SimpleNamespace(exporter=exporter, caller=provider.get_tracer("caller"))


@pytest.fixture(scope="module")
def traced_workers(redis_server, tmp_root):
    """A thread-pool worker (the grouped path) and a prefork one (Celery's request path, batches), each
    exporting its spans to its own file."""
    lanes = {"threads": unique("tr-threads"), "prefork": unique("tr-prefork")}
    files = {pool: tmp_root / f"spans-{lane}.jsonl" for pool, lane in lanes.items()}
    workers = []
    try:
        for pool, lane in lanes.items():
            env = {"OTEL_TRACES_EXPORTER": "jsonl", "DISPATCH_TRACES_FILE": str(files[pool]),
                   "OTEL_BSP_SCHEDULE_DELAY": "50"}
            workers.append(Worker(lane, tmp_root / "logs", pool=pool, concurrency=2, env=env).start())
        yield {pool: SimpleNamespace(lane=lane, file=files[pool]) for pool, lane in lanes.items()}
    finally:
        for worker in workers:
            worker.discard()


def worker_spans(path: Path, task_id: str, names: dict[str, int]) -> list[dict]:
    """The worker's exported spans of ``task_id``, once there are ``names`` (span name prefix -> count)."""

    def found() -> list[dict] | None:
        if not path.exists():
            return None
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        mine = [r for r in rows if r["attributes"].get("dispatch.task_id") == task_id]
        have = {prefix: sum(1 for r in mine if r["name"].startswith(prefix)) for prefix in names}
        return mine if all(have[p] >= n for p, n in names.items()) else None

    return wait_until(found, timeout=30, what=f"spans {names} of {task_id} in {path}")


def hex_id(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


def ids(span) -> tuple[str, str]:
    ctx = span.get_span_context()
    return hex_id(ctx.trace_id, 32), hex_id(ctx.span_id, 16)


def named(rows: list[dict], prefix: str) -> list[dict]:
    return sorted((r for r in rows if r["name"].startswith(prefix)), key=lambda r: r["start_time"])


def stored_text(rc, task_id: str, lane: str) -> str:
    """Every stored string of a waiting task (its lane's lists and its record): where its message is."""
    parts = [m.decode() for q in keys.lane_queues(lane) for m in rc.lrange(q, 0, -1) if task_id.encode() in m]
    parts += [v.decode(errors="replace") for v in rc.hgetall(keys.task_record(task_id)).values()]
    return "\n".join(parts)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_the_callers_span_is_the_parent_of_the_attempt_in_the_worker(spans, traced_workers, pool):
    name = unique("tr-echo")
    lane = traced_workers[pool].lane
    define(name, lane=lane)
    with spans.caller.start_as_current_span("caller") as caller:
        result = dispatch.delay(name, {"x": 1}, chat_id=None)
    assert result.accepted, result
    trace_id, caller_id = ids(caller)
    (sent,) = [s for s in spans.exporter.get_finished_spans() if s.name == f"dispatch {name}"]
    assert hex_id(sent.parent.span_id, 16) == caller_id and ids(sent)[0] == trace_id
    assert sent.attributes["dispatch.task_id"] == result.task_id and sent.attributes["dispatch.accepted"] is True
    assert sent.attributes["messaging.destination.name"] == lane

    rows = worker_spans(traced_workers[pool].file, result.task_id, {"wait": 1, "run": 1, "handler": 1})
    (wait,), (run,), (handler,) = named(rows, "wait"), named(rows, "run"), named(rows, "handler")
    dispatch_id = ids(sent)[1]
    for row in (wait, run, handler):
        assert row["context"]["trace_id"] == trace_id, row
    assert wait["parent_id"] == run["parent_id"] == dispatch_id
    assert handler["parent_id"] == run["context"]["span_id"]
    assert run["kind"] == "SpanKind.CONSUMER" and run["attributes"]["dispatch.outcome"] == "succeeded"
    assert run["attributes"]["dispatch.type"] == name and run["attributes"]["dispatch.lane"] == lane
    assert run["attributes"]["dispatch.attempt"] == 1 and run["attributes"]["dispatch.queue_wait_s"] >= 0


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_retried_tasks_attempts_are_one_trace_each_linked_to_the_one_before(spans, traced_workers, pool):
    name = unique("tr-flaky")
    define(name, handler="demo.flaky", lane=traced_workers[pool].lane,
           policy={"initial_backoff": 0.05, "max_backoff": 0.1, "jitter": 0.0})
    result = dispatch.delay(name, {"fail": "retry", "fail_times": 2})
    assert result.accepted, result
    (sent,) = [s for s in spans.exporter.get_finished_spans() if s.name == f"dispatch {name}"]
    trace_id, dispatch_id = ids(sent)
    rows = worker_spans(traced_workers[pool].file, result.task_id, {"run": 3, "wait": 3})
    runs = named(rows, "run")
    assert [r["attributes"]["dispatch.attempt"] for r in runs] == [1, 2, 3]
    assert [r["attributes"]["dispatch.outcome"] for r in runs] == ["retrying", "retrying", "succeeded"]
    assert {r["context"]["trace_id"] for r in runs} == {trace_id}
    assert {r["parent_id"] for r in runs} == {dispatch_id}
    assert runs[0]["links"] == []
    for before, after in itertools.pairwise(runs):
        (link,) = after["links"]
        assert link["context"]["span_id"] == before["context"]["span_id"]
    assert runs[0]["status"]["status_code"] == "ERROR" and runs[0]["attributes"]["dispatch.retry_delay_s"] > 0
    waits = named(rows, "wait")
    assert all(w["attributes"]["dispatch.queue_wait_s"] >= 0 for w in waits)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_dead_letter_is_a_span_of_its_attempt(spans, traced_workers, pool):
    name = unique("tr-fatal")
    define(name, handler="demo.flaky", lane=traced_workers[pool].lane)
    result = dispatch.delay(name, {"fail": "fatal"})
    rows = worker_spans(traced_workers[pool].file, result.task_id, {"run": 1, "dead_letter": 1})
    (run,), (dead,) = named(rows, "run"), named(rows, "dead_letter")
    assert dead["parent_id"] == run["context"]["span_id"]
    assert dead["attributes"]["dispatch.reason"] == "non_retryable" and dead["status"]["status_code"] == "ERROR"
    assert run["attributes"]["dispatch.outcome"] == "dead"
    (handler,) = named(rows, "handler")
    assert handler["status"]["status_code"] == "ERROR" and handler["events"][0]["name"] == "exception"


def test_a_batch_is_one_handler_span_linked_to_every_items_attempt(spans, traced_workers):
    name = unique("tr-batch")
    define(name, handler="demo.echo_batch", lane=traced_workers["prefork"].lane, batch_size=10,
           batch_window_ms=200)
    results = dispatch_many(name, [{"i": i} for i in range(3)])
    assert all(r.accepted for r in results), results
    (sent,) = [s for s in spans.exporter.get_finished_spans() if s.name == f"dispatch {name}"]
    assert sent.attributes["messaging.batch.message_count"] == 3 and sent.attributes["dispatch.accepted_count"] == 3
    runs = {}
    for r in results:
        (run,) = named(worker_spans(traced_workers["prefork"].file, r.task_id, {"run": 1}), "run")
        assert run["parent_id"] == ids(sent)[1] and run["attributes"]["dispatch.outcome"] == "succeeded"
        runs[run["context"]["span_id"]] = run
    rows = [json.loads(line) for line in traced_workers["prefork"].file.read_text().splitlines()]
    handlers = [r for r in rows if r["name"] == "handler demo.echo_batch" and r["parent_id"] in runs]
    covered = {h["parent_id"] for h in handlers} | {link["context"]["span_id"] for h in handlers
                                                   for link in h["links"]}
    assert set(runs) <= covered


def test_the_http_apis_traceparent_header_is_the_parent_of_the_dispatch(spans, rc):
    name = unique("tr-api")
    lane = unique("tr-api-lane")  # no worker: the message waits, to be read
    define(name, lane=lane)
    client = ApiClient(make_token(unique("svc"), [name]))
    r = client.post("/dispatch", {"task_type": name, "payload": {}}, HTTP_TRACEPARENT=TRACEPARENT)
    assert r.status_code == 202, r.content
    task_id = json.loads(r.content)["task_id"]
    (sent,) = [s for s in spans.exporter.get_finished_spans() if s.name == f"dispatch {name}"]
    assert ids(sent)[0] == "0x0af7651916cd43dd8448eb211c80319c"
    assert hex_id(sent.parent.span_id, 16) == "0xb7ad6b7169203331" and sent.parent.is_remote
    assert "0af7651916cd43dd8448eb211c80319c" in stored_text(rc, task_id, lane)
    r = client.post("/dispatch/bulk", {"task_type": name, "items": [{}, {}]}, HTTP_TRACEPARENT=TRACEPARENT)
    assert r.status_code == 200, r.content
    (bulk,) = [s for s in spans.exporter.get_finished_spans()
               if s.name == f"dispatch {name}" and s.attributes.get("messaging.batch.message_count") == 2]
    assert hex_id(bulk.parent.span_id, 16) == "0xb7ad6b7169203331"
    # A header that is not W3C trace context is ignored: the dispatch starts a trace of its own.
    spans.exporter.clear()
    r = client.post("/dispatch", {"task_type": name, "payload": {}}, HTTP_TRACEPARENT="00-not-a-trace-context")
    assert r.status_code == 202, r.content
    (sent,) = spans.exporter.get_finished_spans()
    assert sent.parent is None


def test_tracing_off_makes_no_span_and_adds_nothing_to_the_message(rc):
    name = unique("tr-off")
    lane = unique("tr-off-lane")
    define(name, lane=lane)
    assert not tracing.enabled()
    result = dispatch.delay(name, {})
    text = stored_text(rc, result.task_id, lane)
    assert result.task_id in text and '"trace"' not in text and "traceparent" not in text
    # No OTEL_* exporter named: a process sets tracing up off, without importing the spans' module (nor
    # OpenTelemetry's tracing; redis-py imports the SDK's metrics itself when it is installed).
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    probe = ("import sys, django; django.setup(); from tasks import tracing; "
             "print(tracing.enabled(), 'tasks.spans' in sys.modules or 'opentelemetry.sdk.trace' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr[-2000:]
